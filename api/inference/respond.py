"""Responses to an inference request, from its worker stream: SSE for streams, one JSON body otherwise.

Streams are SSE (`data: {json}\\n\\n` ... `data: [DONE]\\n\\n`), one chunk per worker delta that carries
tokens, even when its text is empty (as vLLM does); the usage row is written before the stream's end (the
last choice's finish chunk, the usage chunk and [DONE], sent as one write with the end of the body). A
request of n choices (api/inference/choices.py) streams each choice's chunks as they come, each carrying its
`index`, and each choice ends with its own chunk carrying its finish_reason; `usage` counts the
prompt once and the completion tokens of every choice (OpenAI's rule). A non-streamed response collects the
whole generation and is metered before it is returned.
A client that disconnects closes the worker stream (which aborts the engine request) and is metered
`aborted` with the tokens delivered until then, streamed or not.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi.responses import JSONResponse

from api.errors import ApiError
from api.inference.choice_streams import ChoiceStreams
from api.inference.choices import best_sequences, mean_logprob
from api.inference.prepare import Kind, Prepared
from api.inference.streamed_response import MeteredStreamingResponse, StreamEnd
from api.inference.tool_calls import ToolCallStream, parse_tool_calls, streamed_tool_calls
from api.metering import UsageLedger, record_quietly
from api.request_meter import RequestMeter
from cluster.protocol import GenerateEvent, TokenLogprobs


def usage_dict(meter: RequestMeter, status: str) -> dict[str, int]:
    """OpenAI `usage` for what this request is billed."""
    prompt = meter.billed_prompt_tokens(status)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": meter.num_delivered_tokens,
        "total_tokens": prompt + meter.num_delivered_tokens,
    }


def _choice(
    kind: Kind,
    text: str,
    finish_reason: str | None,
    *,
    is_chunk: bool,
    index: int = 0,
    is_first: bool = False,
    has_content: bool = False,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Choice `index`; a chat chunk's delta carries `content` when it has text or `has_content` (token chunks);
    `logprobs`: its tokens' (api/inference/logprobs_format.py), when the request asked."""
    if kind == "text":
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if not is_chunk:
        return {
            "index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
    delta: dict[str, Any] = {"content": text} if (text or has_content or is_first) else {}
    if is_first:
        delta = {"role": "assistant", **delta}
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def _logprobs(
    prepared: Prepared, logprobs: list[TokenLogprobs], prompt: list[TokenLogprobs | None] | None = None
) -> dict[str, Any] | None:
    """The choice's logprobs object for these tokens (None when the request asked for none); `prompt`: the
    prompt's logprobs, shown first (completions' echo)."""
    formatter = prepared.logprobs_formatter
    if formatter is None:
        return None
    echo = (prepared.generate.prompt_token_ids or [], prompt) if prompt is not None else None
    return formatter.format(logprobs, echo)


def _envelope(prepared: Prepared, choices: list[dict[str, Any]], *, is_chunk: bool) -> dict[str, Any]:
    if prepared.kind == "text":
        obj = "text_completion"
    else:
        obj = "chat.completion.chunk" if is_chunk else "chat.completion"
    return {
        "id": prepared.response_id,
        "object": obj,
        "created": prepared.created,
        "model": prepared.model,
        "choices": choices,
    }


def _finish_reason(event: GenerateEvent) -> str:
    return "length" if event.finish_reason == "length" else "stop"


def _final_choice(
    prepared: Prepared, text: str, finish_reason: str, index: int, logprobs: dict[str, Any] | None
) -> dict[str, Any]:
    """A non-streamed choice: the text, or the tool calls it holds (api/inference/tool_calls.py)."""
    calls = parse_tool_calls(text, prepared.tools) if prepared.tools is not None else None
    if not calls:
        return _choice(prepared.kind, text, finish_reason, is_chunk=False, index=index, logprobs=logprobs)
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": "tool_calls"}


def _tool_call_chunks(
    prepared: Prepared, tools: ToolCallStream | None, index: int
) -> tuple[list[dict[str, Any]], str | None]:
    """The streamed chunks that end choice `index` of a request with tools: held-back content, or its tool
    calls (and then the finish reason "tool_calls")."""
    if tools is None:
        return [], None
    content, calls = tools.finish()
    if calls:
        delta = {"tool_calls": streamed_tool_calls(calls)}
        return [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}], "tool_calls"
    return ([_choice(prepared.kind, content, None, is_chunk=True, index=index)] if content else []), None


# ---- non-streamed --------------------------------------------------------------------------------------


async def collect(
    prepared: Prepared, upstream: ChoiceStreams, meter: RequestMeter, ledger: UsageLedger
) -> JSONResponse:
    """A non-streamed response: the whole generation of every sequence, metered before it is returned (with
    best_of, every sequence is billed and the n best are returned: api/inference/choices.py).

    Tokens are timed as they arrive from the worker (so TTFT/TPOT describe the serving, not the buffering).
    A worker error in any choice withdraws them all (the client gets no text). Cancellation (the client
    disconnected: see run_until_disconnect in api/inference/serve.py) closes every choice's worker stream,
    which aborts the engine requests, and meters it `aborted` with the tokens produced until then, as a
    streamed request that loses its client is.
    """
    sequences = [_Sequence([prepared.echo_text or ""]) for _ in range(upstream.num_choices)]
    num_finished = 0
    try:
        async for index, event in upstream.events():
            if event.type == "delta":
                sequences[index].add(event)
                meter.on_delivered(len(event.token_ids))
            elif event.type == "final":
                sequences[index].finish(event)
                num_finished += 1
                if num_finished == upstream.num_choices:
                    await ledger.record(meter, "ok")
                    collected = _collected(prepared, sequences)
                    return JSONResponse(collected | {"usage": usage_dict(meter, "ok")})
            else:
                meter.is_prefilled = meter.is_prefilled or event.num_prompt_tokens > 0
                meter.withdraw_undelivered()
                await ledger.record(meter, "error", f"{event.code}: {event.message}")
                raise ApiError(
                    502, "worker_error", f"the worker failed while generating ({event.code}): {event.message}"
                )
    finally:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
            if not meter.is_recorded:
                await record_quietly(
                    ledger, meter, "aborted", "the client disconnected before the response was ready"
                )
    raise AssertionError("unreachable: a worker stream always ends with final or error")


@dataclass
class _Sequence:
    """One sequence of a non-streamed response, as it arrives: its text, tokens' logprobs, how it ended."""

    texts: list[str]
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_tokens: int = 0
    finish_reason: str | None = None  # set by its final event
    cumulative_logprob: float | None = None  # its final event's (asked for with best_of)

    def add(self, event: GenerateEvent) -> None:
        """Take a delta's text, tokens and logprobs."""
        self.texts.append(event.text)
        self.logprobs += event.logprobs or ()
        self.prompt_logprobs = self.prompt_logprobs or event.prompt_logprobs
        self.num_tokens += len(event.token_ids)

    def finish(self, event: GenerateEvent) -> None:
        """Take its final event."""
        self.finish_reason = _finish_reason(event)
        self.cumulative_logprob = event.cumulative_logprob

    @property
    def score(self) -> float:
        """Its best_of rank: the mean logprob per generated token (api/inference/choices.py)."""
        return mean_logprob(self.cumulative_logprob, self.num_tokens)


def _collected(prepared: Prepared, sequences: list[_Sequence]) -> dict[str, Any]:
    """The response body of finished sequences: all of them, or with best_of the n best, best first."""
    returned = sequences
    if len(sequences) > prepared.num_choices:
        returned = [sequences[i] for i in best_sequences([s.score for s in sequences], prepared.num_choices)]
    choices = [
        _final_choice(
            prepared,
            "".join(sequence.texts),
            sequence.finish_reason or "stop",
            index,
            _logprobs(prepared, sequence.logprobs, sequence.prompt_logprobs),
        )
        for index, sequence in enumerate(returned)
    ]
    return _envelope(prepared, choices, is_chunk=False)


# ---- streamed (SSE) ------------------------------------------------------------------------------------


def sse_line(data: dict[str, Any] | str) -> bytes:
    """One SSE event: `data: <json or literal>` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


# Stands for a token chunk's text while its line is laid out (TokenLines)
_TEXT_MARK = "\x00text\x00"


class TokenLines:
    """The SSE lines of a stream's plain token chunks (no role, echo or logprobs), per choice: the chunk's JSON
    laid out once with a mark for its text, then each token's line is that layout with the text spliced in
    (`json.dumps` of the whole chunk was an eighth of the event loop's CPU per relayed token)."""

    def __init__(self, prepared: Prepared, usage_field: dict[str, None]) -> None:
        self.prepared = prepared
        self.usage_field = usage_field
        self._layouts: dict[int, tuple[bytes, bytes]] = {}

    def line(self, index: int, text: str) -> bytes:
        """Choice `index`'s chunk carrying `text`, as `sse_line` of the same chunk writes it."""
        layout = self._layouts.get(index)
        if layout is None:
            layout = self._layouts[index] = self._layout(index)
        head, tail = layout
        return head + json.dumps(text).encode() + tail

    def _layout(self, index: int) -> tuple[bytes, bytes]:
        choice = _choice(self.prepared.kind, _TEXT_MARK, None, is_chunk=True, index=index, has_content=True)
        line = sse_line(_envelope(self.prepared, [choice], is_chunk=True) | self.usage_field)
        # the text is the line's last string (only nulls follow it), whatever the model name or id holds
        head, _, tail = line.rpartition(json.dumps(_TEXT_MARK).encode())
        return head, tail


def streaming_response(
    prepared: Prepared, upstream: ChoiceStreams, meter: RequestMeter, ledger: UsageLedger
) -> MeteredStreamingResponse:
    """The SSE response of a streamed request."""
    return MeteredStreamingResponse(
        stream(prepared, upstream, meter, ledger),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def stream(
    prepared: Prepared, upstream: ChoiceStreams, meter: RequestMeter, ledger: UsageLedger
) -> AsyncIterator[bytes]:
    """SSE chunks of a streamed response; the usage row is written before the last choice's finish chunk, the
    usage chunk and [DONE], which go as one StreamEnd (with the end of the body, one socket write).

    A client disconnect (cancellation, or aclose at a yield) closes the worker stream, which aborts the
    engine request, and records `aborted` with the tokens delivered so far.
    """
    body = _stream_body(prepared, upstream, meter, ledger)
    try:
        async for chunk in body:
            yield chunk
    finally:
        with anyio.CancelScope(shield=True):
            await body.aclose()  # closed here when this generator is closed at a yield (after a StreamEnd)
            await upstream.aclose()
            await record_quietly(ledger, meter, "aborted", "the client disconnected before the stream ended")


async def _stream_body(
    prepared: Prepared, upstream: ChoiceStreams, meter: RequestMeter, ledger: UsageLedger
) -> AsyncGenerator[bytes, None]:
    usage_field = {"usage": None} if prepared.include_usage else {}
    awaiting_role = set(range(upstream.num_choices)) if prepared.kind == "chat" else set()
    # completions' echo: the prompt's text (and logprobs) lead each choice's first chunk
    awaiting_echo = set(range(upstream.num_choices)) if prepared.echo_text is not None else set()
    status, error = "ok", None
    tools = {i: ToolCallStream(prepared.tools) for i in range(upstream.num_choices)} if prepared.tools else {}
    token_lines = TokenLines(prepared, usage_field)
    ending: list[bytes] = []  # the body's last chunks: sent as one StreamEnd, with the end of the body
    num_finished = 0
    async for index, event in upstream.events():
        is_first = index in awaiting_role
        if event.type == "delta" and (event.token_ids or event.text or is_first):
            # one chunk per worker delta, even when its text is still empty (a special token, a partial
            # UTF-8 character or held back for a stop string or a possible tool call), as vLLM does
            text = tools[index].feed(event.text) if tools else event.text
            if is_first or index in awaiting_echo or prepared.logprobs_formatter is not None:
                choice = _choice(
                    prepared.kind,
                    (prepared.echo_text or "") + text if index in awaiting_echo else text,
                    None,
                    is_chunk=True,
                    index=index,
                    is_first=is_first,
                    has_content=True,
                    logprobs=_logprobs(prepared, event.logprobs or [], event.prompt_logprobs),
                )
                awaiting_role.discard(index)
                awaiting_echo.discard(index)
                yield sse_line(_envelope(prepared, [choice], is_chunk=True) | usage_field)
            else:
                yield token_lines.line(index, text)
        if event.type == "delta":
            meter.on_delivered(len(event.token_ids))  # counted once handed to the server for sending
        elif event.type == "final":
            held, tool_finish = _tool_call_chunks(prepared, tools.get(index), index)
            for choice in held:
                yield sse_line(_envelope(prepared, [choice], is_chunk=True) | usage_field)
            choice = _choice(
                prepared.kind, "", tool_finish or _finish_reason(event), is_chunk=True, index=index
            )
            line = sse_line(_envelope(prepared, [choice], is_chunk=True) | usage_field)
            num_finished += 1
            if num_finished < upstream.num_choices:
                yield line
            else:  # the last choice's end (no token in it) goes with the usage and [DONE]
                ending.append(line)
        else:  # one choice failed (or could not start): the response ends (the others are aborted when the
            # streams close); a sibling's error comes after choice 0's start, so the prompt was prefilled
            status, error = "error", f"{event.code}: {event.message}"
            meter.is_prefilled = meter.is_prefilled or event.num_prompt_tokens > 0 or index > 0
            break
    await ledger.record(meter, status, error)
    if error is not None:
        ending.append(
            sse_line(
                {
                    "error": {
                        "type": "worker_error",
                        "message": f"the worker failed while generating ({error})",
                    }
                }
            )
        )
    if prepared.include_usage:
        ending.append(sse_line(_envelope(prepared, [], is_chunk=True) | {"usage": usage_dict(meter, status)}))
    ending.append(sse_line("[DONE]"))
    yield StreamEnd(b"".join(ending))
