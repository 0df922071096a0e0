"""What the engine returns per step and per completed request."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.core.sampling import TokenLogprob
    from scheduler.core.sequence import Sequence


@dataclass(frozen=True)
class RequestOutput:
    """A delta for one request from one engine step (or a whole completion from `generate`).

    Timestamps are readings of the engine's clock (`time.time()` seconds unless injected);
    first_scheduled_time (the first step that ran any of the request's tokens: its queueing ends there),
    first_token_time and finish_time are None until they happen.
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
    # One per new token when the request asked for logprobs (SamplingParams.logprobs), else None.
    new_logprobs: list[TokenLogprob] | None = None
    # On the first token's delta when the request asked for prompt logprobs: one per prompt token, None first.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # The sum of its tokens' logprobs so far when the request asked (SamplingParams.needs_cumulative_logprob).
    cumulative_logprob: float | None = None

    @classmethod
    def of(
        cls,
        seq: Sequence,
        new_token_ids: list[int],
        new_text: str,
        new_logprobs: list[TokenLogprob] | None = None,
        prompt_logprobs: list[TokenLogprob | None] | None = None,
    ) -> RequestOutput:
        """The delta of `seq` after a step that produced `new_token_ids` (and their logprobs) and `new_text`."""
        return cls(
            request_id=seq.request_id,
            new_token_ids=new_token_ids,
            new_text=new_text,
            is_finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            arrival_time=seq.arrival_time,
            first_token_time=seq.first_token_time,
            finish_time=seq.finish_time,
            adapter_id=seq.adapter_id,
            first_scheduled_time=seq.first_scheduled_time,
            error=seq.error,
            error_code=seq.error_code,
            new_logprobs=new_logprobs,
            prompt_logprobs=prompt_logprobs,
            cumulative_logprob=seq.cumulative_logprob,
        )


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
    logprobs: list[TokenLogprob] | None = None  # one per token when the request asked for them
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token when it asked
    cumulative_logprob: float | None = None  # the sum of its tokens' logprobs when it asked

    @classmethod
    def of(cls, seq: Sequence, outputs: Iterable[RequestOutput] = ()) -> CompletionOutput:
        """The whole completion of a finished `seq`; its logprobs gathered from its step `outputs` when it
        asked for them."""
        outputs = list(outputs)
        logprobs = [lp for out in outputs for lp in out.new_logprobs or ()]
        prompt = next((out.prompt_logprobs for out in outputs if out.prompt_logprobs is not None), None)
        return cls(
            request_id=seq.request_id,
            prompt_token_ids=list(seq.prompt_token_ids),
            token_ids=seq.output_token_ids,
            text=seq.output_text,
            finish_reason=seq.finish_reason,
            adapter_id=seq.adapter_id,
            arrival_time=seq.arrival_time,
            first_token_time=seq.first_token_time,
            finish_time=seq.finish_time,
            logprobs=logprobs if seq.sampling_params.logprobs is not None else None,
            prompt_logprobs=prompt,
            cumulative_logprob=seq.cumulative_logprob,
        )
