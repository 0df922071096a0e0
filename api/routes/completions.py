"""OpenAI-compatible inference: /v1/completions, /v1/chat/completions, /v1/adapters/{name}/completions.

`model` is an adapter name (its latest ready version), `name@N` (a pinned version) or the base model name
(no adapter). One request = one worker generation = exactly one usage row (see api/metering.py):
auth -> parse + refuse unsupported fields -> resolve the model -> tokenize and size-check the prompt ->
rate limit -> route to a worker and read its first event (one retry on another worker) -> stream back.
Every refusal after authentication is metered as `rejected` with zero tokens. An admitted request's row is
written `in_progress` while it is routed and prefilled (no token is sent before it is durable) and streams
are checkpointed as they go, so a crash of this process bills what was delivered (api/metering.py).
Streams are SSE (`data: {json}\\n\\n` ... `data: [DONE]\\n\\n`); the usage row is written before [DONE].
A client that disconnects aborts the worker request, streamed or not (api/disconnect.py for non-streamed
responses), and is metered `aborted`. Bodies and prompts are bounded before parsing/tokenizing
(api/request_limits.py).
A stream sends one chunk per worker delta that carries tokens, even when its text is empty (as vLLM does).
vLLM extension fields: `ignore_eos` (bool, forwarded to the engine) and `min_tokens` (only 0, or with
ignore_eos=true and no stop strings, when every completion has max_tokens tokens; else a 400).
"""

from __future__ import annotations

import json
import logging
import reprlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from api.caches import ResolvedModel, TenantAuth, TtlCache
from api.cold_start import ColdStartTimeout, ColdStartWait
from api.deps import InferenceTenant, ServicesDep
from api.disconnect import ClientDisconnected, run_until_disconnect
from api.errors import ApiError
from api.metering import RequestMeter, UsageLedger
from api.openapi import json_request_body
from api.prompting import BaseModelTokenizer, PromptError
from api.request_limits import check_prompt_bounds, parse_json_object, prompt_chars, read_body
from api.schemas import ChatCompletionRequest, CompletionRequest, InferenceRequestBase
from api.services import Services, is_in_memory_directory, live_workers
from api.worker_client import WorkerStream, WorkerUnavailableError
from registry import repository
from registry.errors import RegistryError
from cluster.membership import WorkerRecord
from api.ratelimit import InMemoryRateLimiter, RateLimits
from registry.settings import Settings
from cluster.protocol import AdapterRef, GenerateEvent, GenerateRequest, SamplingSpec
from scheduler.router import RouteRequest

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["completions"])

Kind = Literal["text", "chat"]
RETRY_AFTER_NO_WORKER_S = 2
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the response (never received)
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4
MAX_INLINE_PROMPT_CHARS = 4096  # longer prompts are tokenized in the threadpool, off the event loop
# Fields the route knows but cannot honour, with the only value(s) it accepts for each.
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None, False, True),
}
WORKER_ERROR_STATUS = {"bad_request": 400, "adapter_unavailable": 503, "overloaded": 503, "draining": 503}


@router.post("/completions", openapi_extra=json_request_body(CompletionRequest))
async def create_completion(request: Request, tenant: InferenceTenant, services: ServicesDep) -> Any:
    """Text completion (OpenAI `POST /v1/completions`), plain or streamed."""
    return await serve(request, tenant, services, "text")


@router.post("/chat/completions", openapi_extra=json_request_body(ChatCompletionRequest))
async def create_chat_completion(request: Request, tenant: InferenceTenant, services: ServicesDep) -> Any:
    """Chat completion (OpenAI `POST /v1/chat/completions`), plain or streamed."""
    return await serve(request, tenant, services, "chat")


@router.post("/adapters/{name}/completions", openapi_extra=json_request_body(CompletionRequest))
async def create_adapter_completion(
    name: str, request: Request, tenant: InferenceTenant, services: ServicesDep
) -> Any:
    """Text completion with the adapter in the path (`model` may be omitted, or `name@N` to pin)."""
    return await serve(request, tenant, services, "text", path_model=name)


# ---- preparing a request -------------------------------------------------------------------------------


@dataclass
class Prepared:
    """An admitted request, ready to send to a worker."""

    kind: Kind
    response_id: str
    model: str
    is_stream: bool
    include_usage: bool
    route: RouteRequest
    generate: GenerateRequest


async def serve(
    request: Request,
    tenant: TenantAuth,
    services: Services,
    kind: Kind,
    path_model: str | None = None,
) -> Any:
    """Run one inference request end to end, metering it exactly once."""
    ledger: UsageLedger = services.extras["usage_ledger"]
    meter = ledger.start(tenant.tenant_id)
    upstream: WorkerStream | None = None
    try:
        prepared = await _prepare(request, tenant, services, meter, kind, path_model)
        ledger.open(meter, is_checkpointed=prepared.is_stream)  # in_progress row, written during routing+prefill
        upstream = await _start(services, prepared, meter, request.receive)
        await ledger.wait_opened(meter)  # durable before the first token is sent (api/metering.py)
    except ClientDisconnected:  # left while waiting for a worker: nothing was generated
        await ledger.record(meter, "aborted", "the client disconnected while waiting for a worker")
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except (ApiError, RegistryError, PromptError) as exc:
        await ledger.record(meter, "rejected", _message(exc))
        raise _as_api_error(exc) from exc
    except Exception as exc:
        await _record_quietly(ledger, meter, "error", f"internal error: {exc!r}")
        raise
    except anyio.get_cancelled_exc_class():  # the client went away: its open row must not stay open
        with anyio.CancelScope(shield=True):
            if upstream is not None:
                await upstream.aclose()
            await _record_quietly(ledger, meter, "aborted", "the client disconnected before the response started")
        raise
    if prepared.is_stream:
        return MeteredStreamingResponse(
            _stream(prepared, upstream, meter, ledger),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        return await run_until_disconnect(request.receive, lambda: _collect(prepared, upstream, meter, ledger))
    except ClientDisconnected:  # _collect aborted the worker request and metered it `aborted`
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it: for the access log


def _message(exc: Exception) -> str:
    return getattr(exc, "message", None) or str(exc)


def _as_api_error(exc: Exception) -> Exception:
    if isinstance(exc, PromptError):
        return ApiError(400, "invalid_request", str(exc))
    return exc


async def _prepare(
    request: Request,
    tenant: TenantAuth,
    services: Services,
    meter: RequestMeter,
    kind: Kind,
    path_model: str | None,
) -> Prepared:
    """Validate, resolve, size-check and rate-limit a request.

    The hot path stays on the event loop (no threadpool hop, no DB query): the model comes from the model
    cache, short prompts are tokenized inline and the in-memory limiter is inline. Cache misses, long
    prompts and the Redis limiter run in the threadpool.
    """
    body = await _parse_body(request, services.settings, kind)
    _refuse_unsupported(body)
    model = _model_ref(body.model, path_model)
    meter.model_name = repository.parse_model_ref(model).name
    resolved = await _resolve(services, tenant.tenant_id, model)
    meter.adapter_id, meter.adapter_version_id = resolved.adapter_id, resolved.adapter_version_id
    check_prompt_bounds(body, services.settings)
    tokenizer = _tokenizer(services)
    if prompt_chars(body) <= MAX_INLINE_PROMPT_CHARS:
        prompt_ids = _prompt_ids(tokenizer, body)
    else:
        prompt_ids = await run_in_threadpool(_prompt_ids, tokenizer, body)
    meter.num_prompt_tokens = len(prompt_ids)
    max_tokens = _check_sizes(services, body, len(prompt_ids))
    _check_min_tokens(body, max_tokens)
    if isinstance(services.extras["rate_limiter"], InMemoryRateLimiter):
        _admit(services, tenant.tenant_id, len(prompt_ids) + max_tokens, tenant.limits)
    else:
        await run_in_threadpool(
            _admit, services, tenant.tenant_id, len(prompt_ids) + max_tokens, tenant.limits
        )
    return _prepared(body, kind, model, resolved, prompt_ids, max_tokens, tenant.tenant_id, meter)


def _prepared(
    body: InferenceRequestBase,
    kind: Kind,
    model: str,
    resolved: ResolvedModel,
    prompt_ids: list[int],
    max_tokens: int,
    tenant_id: str,
    meter: RequestMeter,
) -> Prepared:
    response_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{meter.request_id.removeprefix('req-')}"
    sampling = SamplingSpec(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop_list(),
        ignore_eos=body.ignore_eos,
    )
    adapter_key = resolved.adapter.adapter_key if resolved.adapter else None
    return Prepared(
        kind=kind,
        response_id=response_id,
        model=model,
        is_stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        route=RouteRequest(resolved.base_model, adapter_key, len(prompt_ids), max_tokens),
        generate=GenerateRequest(
            request_id=meter.request_id,
            prompt_token_ids=prompt_ids,
            adapter=resolved.adapter,
            sampling=sampling,
            tenant_id=tenant_id,
        ),
    )


async def _parse_body(request: Request, settings: Settings, kind: Kind) -> InferenceRequestBase:
    """The validated body, read within settings.max_request_body_bytes (see api/request_limits.py)."""
    raw = await parse_json_object(await read_body(request, settings.max_request_body_bytes))
    schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        parts = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()]
        raise ApiError(400, "invalid_request", "; ".join(parts)) from exc


def _refuse_unsupported(body: InferenceRequestBase) -> None:
    """400 naming every field this server cannot honour (unknown fields included)."""
    # reprlib: a short repr however large or deep the value (the message quotes the tenant's input)
    problems = [f"{name}={reprlib.repr(value)}" for name, value in (body.model_extra or {}).items()]
    for name, allowed in NO_OP_VALUES.items():
        value = getattr(body, name, None)
        if value not in allowed:
            problems.append(f"{name}={reprlib.repr(value)}")
    response_format = getattr(body, "response_format", None)
    if response_format and response_format.get("type", "text") != "text":
        problems.append(f"response_format={reprlib.repr(response_format)}")
    if problems:
        raise ApiError(
            400,
            "invalid_request",
            f"unsupported field(s): {', '.join(problems)}; remove them "
            "(this server supports n=1 without logprobs, echo, suffix, logit_bias, penalties, tools or "
            "structured output)",
        )
    if len(body.stop_list()) > MAX_STOP_STRINGS or any(not s for s in body.stop_list()):
        raise ApiError(
            400, "invalid_request", f"stop must be a non-empty string or up to {MAX_STOP_STRINGS} of them"
        )


def _model_ref(body_model: str | None, path_model: str | None) -> str:
    if path_model is None:
        if not body_model:
            raise ApiError(
                400, "invalid_request", "model is required: an adapter name, name@N or the base model"
            )
        return body_model
    if body_model and repository.parse_model_ref(body_model).name != path_model:
        raise ApiError(
            400,
            "invalid_request",
            f"model {body_model!r} does not match the adapter {path_model!r} "
            "in the path; omit model or use name@N of the same adapter",
        )
    return body_model or path_model


async def _resolve(services: Services, tenant_id: str, model: str) -> ResolvedModel:
    """The adapter version to apply and the base model to route to (model cache, else the DB in a thread)."""
    base_name = services.settings.base_model_name
    if model == base_name:
        return ResolvedModel(base_model=base_name)
    cache: TtlCache[tuple[str, str], ResolvedModel] = services.extras["model_cache"]
    resolved = cache.get((tenant_id, model))
    if resolved is None:
        resolved = await run_in_threadpool(_resolve_in_db, services, tenant_id, model)
        cache.put((tenant_id, model), resolved)
    return resolved


def _resolve_in_db(services: Services, tenant_id: str, model: str) -> ResolvedModel:
    with services.session_factory() as session:
        adapter, version = repository.resolve_model(session, tenant_id, model)
        ref = AdapterRef(
            adapter_key=version.id,
            sha256=version.sha256 or "",
            config_sha256=version.config_sha256,  # None for pre-0002 rows: workers key those by version id
            config_blob_key=version.config_blob_key or "",
            weights_blob_key=version.weights_blob_key or "",
            rank=version.rank or 0,
        )
        return ResolvedModel(adapter.base_model_name, ref, adapter.id, version.id)


def _tokenizer(services: Services) -> BaseModelTokenizer:
    tokenizer = services.extras.get("tokenizer")
    if tokenizer is None:
        raise ApiError(
            503,
            "unavailable",
            "no base model tokenizer is configured on this API server "
            "(set LORAHOST_BASE_MODEL_PATH to the base model directory)",
        )
    return tokenizer


def _prompt_ids(tokenizer: BaseModelTokenizer, body: InferenceRequestBase) -> list[int]:
    if isinstance(body, ChatCompletionRequest):
        return tokenizer.encode_chat(body.messages)[1]
    assert isinstance(body, CompletionRequest)
    prompt = body.prompt
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if not prompt:
        raise PromptError("the prompt is empty")
    if all(isinstance(p, int) for p in prompt):
        return tokenizer.check_token_ids(prompt)
    only = prompt[0]
    if len(prompt) == 1 and isinstance(only, str):
        return tokenizer.encode(only)
    if len(prompt) == 1 and isinstance(only, list):
        return tokenizer.check_token_ids(only)
    raise PromptError(
        "prompt must be a string, a list of one string, or one list of token ids (batches of "
        f"prompts are not supported: got {len(prompt)}); send one request per prompt"
    )


def _check_sizes(services: Services, body: InferenceRequestBase, num_prompt: int) -> int:
    """The effective max_tokens, after refusing prompts and completions beyond the limits."""
    settings, context = services.settings, _tokenizer(services).max_context_tokens
    if num_prompt == 0:
        raise PromptError("the prompt is empty")
    if num_prompt > settings.max_prompt_tokens:
        raise PromptError(
            f"the prompt has {num_prompt} tokens; the limit is {settings.max_prompt_tokens} tokens"
        )
    requested = getattr(body, "max_completion_tokens", None) or body.max_tokens
    if requested is not None and requested > settings.max_completion_tokens:
        raise PromptError(f"max_tokens={requested} is above the limit of {settings.max_completion_tokens}")
    if requested is None:
        default = (
            DEFAULT_COMPLETION_MAX_TOKENS
            if isinstance(body, CompletionRequest)
            else settings.max_completion_tokens
        )
        requested = min(default, (context or num_prompt + default) - num_prompt)
    if context is not None and num_prompt + requested > context:
        raise PromptError(
            f"prompt ({num_prompt} tokens) + max_tokens ({requested}) exceeds the model's context of "
            f"{context} tokens; shorten the prompt or lower max_tokens"
        )
    return requested


def _check_min_tokens(body: InferenceRequestBase, max_tokens: int) -> None:
    """Refuse a min_tokens the engine cannot guarantee (it has no min_tokens; see InferenceRequestBase)."""
    min_tokens = body.min_tokens or 0
    if min_tokens > max_tokens:
        raise PromptError(f"min_tokens={min_tokens} is above max_tokens={max_tokens}; lower min_tokens")
    if min_tokens > 0 and (not body.ignore_eos or body.stop_list()):
        raise PromptError(
            f"min_tokens={min_tokens} is only supported with ignore_eos=true and no stop strings (the "
            "completion then always has max_tokens tokens); send min_tokens=0 or set ignore_eos=true"
        )


def _admit(services: Services, tenant_id: str, num_tokens: int, limits: RateLimits) -> None:
    decision = services.extras["rate_limiter"].acquire(tenant_id, num_tokens, limits)
    if not decision.is_allowed:
        raise ApiError(
            429, "rate_limited", decision.reason, headers={"Retry-After": str(decision.retry_after_s)}
        )


async def _start(services: Services, prepared: Prepared, meter: RequestMeter, receive: Receive) -> WorkerStream:
    """Route and open the worker stream, waiting through a cold start (api/cold_start.py); worker refusals
    before any token become HTTP errors."""
    wait = ColdStartWait(services.settings, prepared.route.base_model, receive, services.extras.get("metrics"))
    client = services.extras["worker_client"]
    try:
        while True:
            records = await wait.ready_records(lambda: _live_records(services))
            try:
                upstream = await client.start(prepared.route, records, prepared.generate)
                break
            except WorkerUnavailableError as exc:
                log.info("request %s waits for a worker: %s", prepared.generate.request_id, exc)
                await wait.pause(str(exc))
    except ColdStartTimeout as exc:
        raise ApiError(
            503,
            "unavailable",
            f"{exc}; retry shortly (workers are starting or busy)",
            headers={"Retry-After": str(RETRY_AFTER_NO_WORKER_S)},
        ) from exc
    finally:
        wait.observe()
    meter.worker_id = upstream.worker_id
    first = upstream.first
    if first.type == "error":
        await upstream.aclose()
        await _record_worker_error(services.extras["usage_ledger"], meter, first)
        status = WORKER_ERROR_STATUS.get(first.code or "", 502)
        raise ApiError(
            status,
            "worker_error" if status >= 500 else "invalid_request",
            f"the worker refused the request ({first.code}): {first.message}",
            headers={"Retry-After": str(RETRY_AFTER_NO_WORKER_S)} if status == 503 else None,
        )
    return upstream


async def _live_records(services: Services) -> list[WorkerRecord]:
    if is_in_memory_directory(services):
        return live_workers(services)
    return await anyio.to_thread.run_sync(live_workers, services)  # Redis: a network call


async def _record_worker_error(ledger: UsageLedger, meter: RequestMeter, event: GenerateEvent) -> None:
    if event.num_prompt_tokens:
        meter.is_prefilled = True
    await ledger.record(meter, "error", f"{event.code}: {event.message}")


# ---- responses -----------------------------------------------------------------------------------------


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
    is_first: bool = False,
    has_content: bool = False,
) -> dict[str, Any]:
    """One choice; a chat chunk's delta carries `content` when it has text or `has_content` (token chunks)."""
    if kind == "text":
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if not is_chunk:
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    delta: dict[str, Any] = {"content": text} if (text or has_content or is_first) else {}
    if is_first:
        delta = {"role": "assistant", **delta}
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _envelope(prepared: Prepared, choices: list[dict[str, Any]], *, is_chunk: bool) -> dict[str, Any]:
    if prepared.kind == "text":
        obj = "text_completion"
    else:
        obj = "chat.completion.chunk" if is_chunk else "chat.completion"
    return {
        "id": prepared.response_id,
        "object": obj,
        "created": int(time.time()),
        "model": prepared.model,
        "choices": choices,
    }


def _finish_reason(event: GenerateEvent) -> str:
    return "length" if event.finish_reason == "length" else "stop"


async def _collect(
    prepared: Prepared, upstream: WorkerStream, meter: RequestMeter, ledger: UsageLedger
) -> JSONResponse:
    """A non-streamed response: the whole generation, metered before it is returned.

    Tokens are timed as they arrive from the worker (so TTFT/TPOT describe the serving, not the buffering).
    A worker error withdraws them (the client gets no text). Cancellation (the client disconnected: see
    run_until_disconnect in serve) closes the worker stream, which aborts the engine request, and meters it
    `aborted` with the tokens produced until then, as a streamed request that loses its client is.
    """
    texts: list[str] = []
    try:
        async for event in upstream.events():
            if event.type == "delta":
                texts.append(event.text)
                meter.on_delivered(len(event.token_ids))
            elif event.type == "final":
                await ledger.record(meter, "ok")
                choice = _choice(prepared.kind, "".join(texts), _finish_reason(event), is_chunk=False)
                body = _envelope(prepared, [choice], is_chunk=False)
                return JSONResponse(body | {"usage": usage_dict(meter, "ok")})
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
                await _record_quietly(
                    ledger, meter, "aborted", "the client disconnected before the response was ready"
                )
    raise AssertionError("unreachable: a worker stream always ends with final or error")


def _sse_line(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


async def _stream(
    prepared: Prepared, upstream: WorkerStream, meter: RequestMeter, ledger: UsageLedger
) -> AsyncIterator[bytes]:
    """SSE chunks of a streamed response; the usage row is written before the usage chunk and [DONE].

    A client disconnect (cancellation, or aclose at a yield) closes the worker stream, which aborts the
    engine request, and records `aborted` with the tokens delivered so far.
    """
    try:
        async for chunk in _stream_body(prepared, upstream, meter, ledger):
            yield chunk
    finally:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
            await _record_quietly(ledger, meter, "aborted", "the client disconnected before the stream ended")


async def _stream_body(
    prepared: Prepared, upstream: WorkerStream, meter: RequestMeter, ledger: UsageLedger
) -> AsyncIterator[bytes]:
    usage_field = {"usage": None} if prepared.include_usage else {}
    is_first = prepared.kind == "chat"
    status, error = "ok", None
    async for event in upstream.events():
        if event.type == "delta" and (event.token_ids or event.text or is_first):
            # one chunk per worker delta, even when its text is still empty (a special token, a partial
            # UTF-8 character or held back for a stop string), as vLLM does: clients see TTFT and progress
            choice = _choice(
                prepared.kind, event.text, None, is_chunk=True, is_first=is_first, has_content=True
            )
            is_first = False
            yield _sse_line(_envelope(prepared, [choice], is_chunk=True) | usage_field)
        if event.type == "delta":
            meter.on_delivered(len(event.token_ids))  # counted once handed to the server for sending
        elif event.type == "final":
            choice = _choice(prepared.kind, "", _finish_reason(event), is_chunk=True)
            yield _sse_line(_envelope(prepared, [choice], is_chunk=True) | usage_field)
        else:
            status, error = "error", f"{event.code}: {event.message}"
            meter.is_prefilled = meter.is_prefilled or event.num_prompt_tokens > 0
    await ledger.record(meter, status, error)
    if error is not None:
        yield _sse_line(
            {"error": {"type": "worker_error", "message": f"the worker failed while generating ({error})"}}
        )
    if prepared.include_usage:
        yield _sse_line(_envelope(prepared, [], is_chunk=True) | {"usage": usage_dict(meter, status)})
    yield _sse_line("[DONE]")


async def _record_quietly(ledger: UsageLedger, meter: RequestMeter, status: str, message: str) -> None:
    """Record from a finaliser: log failures instead of masking the original exit."""
    try:
        await ledger.record(meter, status, message)
    except Exception:  # noqa: BLE001 - a finaliser must not raise; the ledger logged the cause
        log.warning("request %s: usage not recorded from the finaliser", meter.request_id)


class MeteredStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its body generator, so its finaliser (abort the worker request,
    record the usage) runs even when the client disconnects while the generator waits at a `yield`.

    The headers and the first chunk (built from the worker's first event, already read) are sent from the
    request's own task, before the streaming task and the disconnect listener are spawned: the first token
    does not wait for an event-loop turn (or, under GIL contention, for another thread's time slice).
    """

    is_started: bool = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["type"] == "http":
                await self._send_start(send)
                first = await anext(self.body_iterator, None)  # type: ignore[call-overload]
                if first is not None:
                    await send({"type": "http.response.body", "body": _as_bytes(first), "more_body": True})
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]

    async def _send_start(self, send: Send) -> None:
        if not self.is_started:
            self.is_started = True
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})

    async def stream_response(self, send: Send) -> None:
        await self._send_start(send)
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": _as_bytes(chunk), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _as_bytes(chunk: str | bytes | memoryview) -> bytes | memoryview:
    return chunk.encode() if isinstance(chunk, str) else chunk
