"""The platform's sampling parameters as vLLM's, and vLLM's logprobs as the platform's (pure functions: vllm is
not imported here; gpu_workers/worker/vllm_engine.py hands in vLLM's SamplingParams class).

vLLM computes logprobs in the mode of its `logprobs_mode` engine argument; the worker asks for
"processed_logprobs" where its vLLM has the argument (`LOGPROBS_MODE`), the native engine's definition: after
penalties and bias, before temperature (scheduler/core/sampling.py). Older vLLM reports the raw model
distribution (its only mode then).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler.core.sampling import SamplingParams, TokenLogprob
from scheduler.core.structured_output import StructuredOutput

LOGPROBS_MODE = "processed_logprobs"
# vLLM's SamplingParams field for an output constraint and the class it takes: `structured_outputs`
# (StructuredOutputsParams, vLLM >= 0.10.2) or `guided_decoding` (GuidedDecodingParams, before)
StructuredField = tuple[str, Callable[..., Any]]


def vllm_sampling_params(
    params: SamplingParams, factory: Callable[..., Any], structured: StructuredField | None = None
) -> Any:
    """vLLM's SamplingParams (built by `factory`) for the platform's (top_k 0: off in both); an output
    constraint goes into `structured` (ValueError when this vLLM has none)."""
    extra: dict[str, Any] = {}
    if params.structured_output is not None:
        if structured is None:
            raise ValueError("this vLLM has no structured outputs; send the request without a constraint")
        field, make = structured
        extra[field] = make(**vllm_constraint(params.structured_output))
    return factory(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=max(params.top_k, 0),
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        stop=list(params.stop),
        ignore_eos=params.ignore_eos,
        min_tokens=params.min_tokens,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        logit_bias=dict(params.logit_bias) or None,
        logprobs=vllm_logprobs(params),
        prompt_logprobs=params.prompt_logprobs,
        **extra,
    )


def vllm_logprobs(params: SamplingParams) -> int | None:
    """vLLM's `logprobs`: the request's, or 0 (the sampled token's only) when it needs only the cumulative
    logprob, which vLLM computes only for a request with logprobs (CompletionOutput.cumulative_logprob)."""
    if params.logprobs is None and params.needs_cumulative_logprob:
        return 0
    return params.logprobs


def vllm_constraint(structured: StructuredOutput) -> dict[str, Any]:
    """The keyword of vLLM's StructuredOutputsParams / GuidedDecodingParams for a constraint. A `grammar` is
    llguidance's Lark dialect: vLLM reads it as such with its "guidance" backend."""
    kind = structured.kind
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        return {"json": json.loads(structured.spec)}
    if kind == "choice":
        return {"choice": structured.choices}
    return {kind: structured.spec}


def logprobs_from_vllm(
    token_ids: Sequence[int], entries: Sequence[Mapping[int, Any]], num_top: int
) -> list[TokenLogprob]:
    """The platform's TokenLogprobs from vLLM's per-token dicts (token id -> Logprob(logprob, rank, ...): the
    top `num_top` by rank plus the sampled token, whatever its rank), one per token of `token_ids`."""
    result = []
    for token_id, entry in zip(token_ids, entries):
        ranked = sorted(
            (lp.rank, token, float(lp.logprob))
            for token, lp in entry.items()
            if lp.rank is not None and lp.rank <= num_top
        )
        top = tuple((token, logprob) for _, token, logprob in ranked)
        result.append(TokenLogprob(token_id, float(entry[token_id].logprob), top))
    return result


def prompt_logprobs_from_vllm(
    prompt_token_ids: Sequence[int], entries: Sequence[Mapping[int, Any] | None] | None, num_top: int | None
) -> list[TokenLogprob | None] | None:
    """vLLM's `RequestOutput.prompt_logprobs` (None for the first token, then a dict per token) as the
    platform's, one per prompt token (None first); None when the request asked for none."""
    if num_top is None or entries is None:
        return None
    tokens = list(prompt_token_ids[1:])
    rest = [entry or {} for entry in entries[1:]]
    return [None, *logprobs_from_vllm(tokens, rest, num_top)]
