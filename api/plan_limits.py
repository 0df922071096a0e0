"""A plan's caps on the shape of one inference request: how many choices (`n`, and the sequences completions'
`best_of` generates) and how many alternatives per token (`top_logprobs`; the completions API's integer
`logprobs`) a tenant may ask for.

Both multiply work without multiplying the prompt: `n` choices cost n sequences of decode (their prompt is
prefilled once, api/inference/choices.py), and each top-logprobs alternative is a sort entry and bytes on the
wire per token. A plan column left NULL means the default below, which keeps an unconfigured deployment
close to OpenAI's behaviour. A request above its plan's cap is a 400 naming the cap, like max_tokens above
the server's limit (the client can send a smaller value; a 403 is for what no change of the request fixes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.errors import ApiError

DEFAULT_MAX_N = 8
MAX_N = 128  # the most a plan may allow (OpenAI's own cap on n)
DEFAULT_MAX_TOP_LOGPROBS = 20
MAX_TOP_LOGPROBS = 20  # OpenAI's cap on top_logprobs: a plan may lower it, not raise it


@dataclass(frozen=True)
class SamplingLimits:
    """A plan's caps on n and top_logprobs (the defaults when the plan leaves them NULL)."""

    max_n: int = DEFAULT_MAX_N
    max_top_logprobs: int = DEFAULT_MAX_TOP_LOGPROBS

    @classmethod
    def of_plan(cls, max_n: int | None, max_top_logprobs: int | None) -> SamplingLimits:
        """The caps of a plan's columns (NULL: the default)."""
        return cls(
            DEFAULT_MAX_N if max_n is None else max_n,
            DEFAULT_MAX_TOP_LOGPROBS if max_top_logprobs is None else max_top_logprobs,
        )


def requested_top_logprobs(body: Any) -> tuple[str, int] | None:
    """The field asking for per-token alternatives and how many: chat's `top_logprobs`, or the completions
    API's integer `logprobs` (chat's `logprobs` is a boolean); None when neither asks for any."""
    top = getattr(body, "top_logprobs", None)
    if isinstance(top, int) and not isinstance(top, bool):
        return "top_logprobs", top
    logprobs = getattr(body, "logprobs", None)
    if isinstance(logprobs, int) and not isinstance(logprobs, bool):
        return "logprobs", logprobs
    return None


def check_plan_limits(body: Any, limits: SamplingLimits) -> None:
    """400 naming the plan's cap when the request asks for more choices (n, or completions' best_of: the
    sequences generated) or top logprobs than it allows."""
    for field in ("n", "best_of"):
        value = getattr(body, field, None) or 1
        if value > limits.max_n:
            raise ApiError(
                400,
                "invalid_request",
                f"{field}={value} is above your plan's max_n of {limits.max_n}; send {field} <= "
                f"{limits.max_n} (or several requests), or ask the operator for a plan with a higher max_n",
            )
    requested = requested_top_logprobs(body)
    if requested is not None and requested[1] > limits.max_top_logprobs:
        field, value = requested
        raise ApiError(
            400,
            "invalid_request",
            f"{field}={value} is above your plan's max_top_logprobs of {limits.max_top_logprobs}; send "
            f"{field} <= {limits.max_top_logprobs}, or ask the operator for a plan with a higher max_top_logprobs",
        )
