"""What the engine returns per step and per completed request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestOutput:
    """A delta for one request from one engine step (or a whole completion from `generate`).

    Timestamps are `time.time()` seconds; first_scheduled_time (the first step that ran any of the request's
    tokens: its queueing ends there), first_token_time and finish_time are None until they happen.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    is_finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None
    adapter_id: str | None = None
    first_scheduled_time: float | None = None
    error: str | None = None  # set with finish_reason "error": why the engine stopped this request
    # With error: "adapter_unavailable" (a planned adapter copy failed: its host files vanished or became
    # invalid) or "numeric_overflow" (the request's logits went non-finite); see errors.REQUEST_ERRORS.
    error_code: str | None = None


@dataclass(frozen=True)
class CompletionOutput:
    """A finished request from `LLMEngine.generate`: all token ids and the full text."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    adapter_id: str | None
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None
