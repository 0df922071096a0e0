"""The sampling fields of an inference request: checks that need the resolved model (logit_bias ids against
its vocabulary, min_tokens against max_tokens, top_logprobs with logprobs) and the wire `SamplingSpec`.

Ranges a field has on its own (penalties, bias values, logprobs counts) are checked by the schemas
(api/inference/schemas.py); what passes both is what the engine accepts (scheduler/core/sampling.py), so a
request is never refused by a worker for a value the API let through.
"""

from __future__ import annotations

from api.inference.schemas import ChatCompletionRequest, CompletionRequest, InferenceRequestBase
from api.prompting import BaseModelTokenizer, PromptError
from cluster.protocol import SamplingSpec


def num_logprobs(body: InferenceRequestBase) -> int | None:
    """How many top alternatives each token's logprob comes with (None: no logprobs asked)."""
    if isinstance(body, ChatCompletionRequest):
        return (body.top_logprobs or 0) if body.logprobs else None
    assert isinstance(body, CompletionRequest)
    return body.logprobs


def check_sampling_fields(body: InferenceRequestBase, tokenizer: BaseModelTokenizer, max_tokens: int) -> None:
    """PromptError (400) naming the field when a value does not fit this model or this request."""
    min_tokens = body.min_tokens or 0
    if min_tokens > max_tokens:
        raise PromptError(f"min_tokens={min_tokens} is above max_tokens={max_tokens}; lower min_tokens")
    if isinstance(body, ChatCompletionRequest) and body.top_logprobs is not None and not body.logprobs:
        raise PromptError("top_logprobs needs logprobs=true; set logprobs=true or drop top_logprobs")
    vocab_size = tokenizer.vocab_size
    for name, token_ids in (
        ("logit_bias", [int(t) for t in body.logit_bias or {}]),
        ("stop_token_ids", body.stop_token_ids or []),
    ):
        outside = [t for t in token_ids if not 0 <= t < vocab_size]
        if outside:
            raise PromptError(
                f"{name} names token id(s) {outside[:5]} outside this model's vocabulary (0 <= id < {vocab_size})"
            )


def sampling_spec(body: InferenceRequestBase, max_tokens: int) -> SamplingSpec:
    """The wire sampling parameters of a checked request."""
    return SamplingSpec(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop_list(),
        stop_token_ids=list(body.stop_token_ids or []),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens or 0,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=body.repetition_penalty or 1.0,
        logit_bias={int(t): v for t, v in (body.logit_bias or {}).items()},
        logprobs=num_logprobs(body),
        needs_cumulative_logprob=body.num_sequences > body.num_choices,  # best_of ranks by it
        prompt_logprobs=body.logprobs if isinstance(body, CompletionRequest) and body.echo else None,
    )
