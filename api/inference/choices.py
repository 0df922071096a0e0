"""The n choices of one request (OpenAI's `n`): n engine requests of one prompt, on one worker, with the
prompt prefilled once.

The platform fans a request out above the engine contract, so both engines (the native one and vLLM) serve
`n` the same way and the contract does not change: choice 0 is routed like any request (the one routing
decision: api/inference/route.py), and choices 1..n-1 are opened on the same worker only once choice 0's first
event has arrived. That event means choice 0's prompt was prefilled; the native engine's core hands a running
sequence's computed full prompt blocks to its prefix cache at the start of the next step's plan, before it
admits waiting requests (scheduler/core/batch_scheduler.py `_plan_step`), so the other choices, keyed by the
same cache namespace and adapter, find every full block of the prompt cached and prefill only its last
partial block (at least one token, for a logit). The engine's `num_prefix_cache_hit_tokens` counts it. vLLM
does the same with its own prefix caching. The siblings then go through the engine's admission like any
request: its policy, not the order of arrival, decides when they run.

Seeds: with `seed` s, choice 0 uses s (so n=1 is unchanged) and choice i > 0 a seed derived from (s, i): the
choices differ, and the whole response is reproducible. Without a seed every choice samples on its own.

`best_of` (completions only, as OpenAI and vLLM): best_of sequences run as the siblings above (same seeds
rule), each asking the worker for its cumulative log probability (SamplingSpec.needs_cumulative_logprob,
reported on its `final` event), and the response returns the n with the highest mean log probability per
generated token (OpenAI's "highest log probability per token"; vLLM's beam score with length penalty 1), best
first, re-indexed 0..n-1. The logprobs are the engine's usual ones: after logit_bias and penalties, before temperature
(docs/sampling.md). Every sequence's tokens are billed (OpenAI does). A best_of response cannot be streamed
(which sequences win is known only at the end: OpenAI refuses it too), and best_of < n cannot be honoured.
"""

from __future__ import annotations

import math

from api.errors import ApiError
from api.inference.schemas import MAX_SEED, InferenceRequestBase
from cluster.protocol import GenerateRequest

GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment: consecutive indices land far apart


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of a request seeded with `seed` (None stays None; choice 0 keeps `seed`)."""
    if seed is None or index == 0:
        return seed
    z = (seed + index * GOLDEN_GAMMA) & MAX_SEED
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MAX_SEED
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MAX_SEED
    return z ^ (z >> 31)


def choice_request_id(request_id: str, index: int) -> str:
    """The worker request id of choice `index` (choice 0 keeps the request's own id, which the usage row has)."""
    return request_id if index == 0 else f"{request_id}.{index}"


def choice_request(first: GenerateRequest, index: int) -> GenerateRequest:
    """Choice `index`'s worker request: choice 0's, with its own id and seed."""
    sampling = first.sampling.model_copy(update={"seed": choice_seed(first.sampling.seed, index)})
    return first.model_copy(
        update={"request_id": choice_request_id(first.request_id, index), "sampling": sampling}
    )


def sibling_requests(first: GenerateRequest, num_choices: int) -> list[GenerateRequest]:
    """The worker requests of choices 1..num_choices-1."""
    return [choice_request(first, index) for index in range(1, num_choices)]


def check_best_of(body: InferenceRequestBase) -> None:
    """400 for a best_of that cannot be honoured: below n, or above n in a streamed request."""
    best_of = getattr(body, "best_of", None)
    if best_of is None or best_of == body.num_choices:
        return
    if best_of < body.num_choices:
        raise ApiError(400, "invalid_request", f"best_of={best_of} must be >= n={body.num_choices}")
    if body.stream:
        raise ApiError(
            400,
            "invalid_request",
            f"best_of={best_of} > n={body.num_choices} cannot be streamed (the best sequences are known only "
            "once all have finished); send stream=false, or drop best_of",
        )


def mean_logprob(cumulative_logprob: float | None, num_tokens: int) -> float:
    """A sequence's best_of score: its mean log probability per generated token (-inf when its worker
    reported none: it ranks last)."""
    if cumulative_logprob is None:
        return -math.inf
    return cumulative_logprob / max(num_tokens, 1)


def best_sequences(scores: list[float], num_choices: int) -> list[int]:
    """The indices of the `num_choices` highest scores, best first (the lower index first on a tie)."""
    return sorted(range(len(scores)), key=lambda index: (-scores[index], index))[:num_choices]
