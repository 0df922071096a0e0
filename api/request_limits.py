"""Bounds on an inference request, checked before any expensive work so one tenant's huge or hostile body
cannot hold the event loop (or memory) that other tenants' requests share.

  body       at most settings.limits.max_request_body_bytes (413). A declared Content-Length above it is refused
             before anything is read; otherwise (chunked, or no length) the bytes are counted as they arrive
             and reading stops at the limit.
  JSON       an object nested at most MAX_JSON_DEPTH levels (400); large bodies are parsed off the loop.
  prompt     at most settings.limits.max_prompt_tokens x settings.limits.max_prompt_chars_per_token characters of prompt
             (or chat message) text, and at most max_prompt_tokens token ids, before tokenizing (400): the
             exact token count is checked after tokenizing, this bound only keeps that tokenization small.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from api.errors import ApiError
from api.inference.schemas import ChatCompletionRequest, CompletionRequest, InferenceRequestBase
from api.prompting import PromptError
from api.request_text import check_json_text
from settings import Settings

MAX_JSON_DEPTH = 64  # OpenAI request bodies nest a handful of levels (messages -> content parts -> part)
MAX_INLINE_JSON_BYTES = 64 * 1024  # larger bodies are parsed in the threadpool, off the event loop


def body_too_large(max_bytes: int) -> ApiError:
    """The 413 for a body over the limit (the message says what to change)."""
    return ApiError(
        413,
        "payload_too_large",
        f"the request body is larger than {max_bytes} bytes (the server's max_request_body_bytes); "
        "send a shorter prompt or fewer messages",
    )


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length", "")
    return int(value) if value.isdigit() else None


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed max_bytes."""
    declared = _declared_length(request)
    if declared is not None and declared > max_bytes:
        raise body_too_large(max_bytes)
    chunks: list[bytes] = []
    num_bytes = 0
    try:
        async for chunk in request.stream():
            num_bytes += len(chunk)
            if num_bytes > max_bytes:
                raise body_too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise ApiError(400, "invalid_request", "the client disconnected while sending the body") from exc
    return b"".join(chunks)


def exceeds_depth(value: Any, max_depth: int) -> bool:
    """True if value (parsed JSON) nests lists/objects more than max_depth levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _too_deep() -> ApiError:
    return ApiError(
        400,
        "invalid_request",
        f"the body is nested too deeply; keep JSON nesting within {MAX_JSON_DEPTH} levels",
    )


async def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 for invalid JSON, another top-level type, too deep a nesting or a string
    that is not valid Unicode (api/request_text.py)."""
    try:
        value = (
            json.loads(raw) if len(raw) <= MAX_INLINE_JSON_BYTES else await run_in_threadpool(json.loads, raw)
        )
    except RecursionError as exc:
        raise _too_deep() from exc
    except ValueError as exc:
        raise ApiError(400, "invalid_request", f"the body must be a JSON object: {exc}") from exc
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    if exceeds_depth(value, MAX_JSON_DEPTH):
        raise _too_deep()
    check_json_text(value)
    return value


def _content_chars(content: Any) -> int:
    """Characters of a chat message's text (a string, or the text of its parts)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def prompt_chars(body: InferenceRequestBase) -> int:
    """Characters of prompt text that tokenizing would read (token-id prompts count 0)."""
    if isinstance(body, ChatCompletionRequest):
        return sum(_content_chars(m.get("content")) for m in body.messages if isinstance(m, dict))
    prompt = body.prompt if isinstance(body, CompletionRequest) else ""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) for p in prompt if isinstance(p, str))


def num_prompt_ids(body: InferenceRequestBase) -> int:
    """Token ids sent as the prompt (0 for text prompts)."""
    prompt = body.prompt if isinstance(body, CompletionRequest) else ""
    if isinstance(prompt, str):
        return 0
    return sum(1 if isinstance(p, int) else len(p) if isinstance(p, list) else 0 for p in prompt)


def check_prompt_bounds(body: InferenceRequestBase, settings: Settings) -> None:
    """Refuse (PromptError -> 400) a prompt that cannot fit max_prompt_tokens, before tokenizing it."""
    max_tokens = settings.limits.max_prompt_tokens
    max_chars = max_tokens * settings.limits.max_prompt_chars_per_token
    num_chars = prompt_chars(body)
    if num_chars > max_chars:
        raise PromptError(
            f"the prompt has {num_chars} characters; at most {max_chars} characters are accepted "
            f"({max_tokens} tokens x {settings.limits.max_prompt_chars_per_token} characters per token); "
            "shorten the prompt"
        )
    num_ids = num_prompt_ids(body)
    if num_ids > max_tokens:
        raise PromptError(f"the prompt has {num_ids} tokens; the limit is {max_tokens} tokens")
