"""Token sampling: the step's pipeline (`sample`) and its last stage (`sample_tokens`: greedy argmax, or
temperature / top-k / top-p with an optional per-request generator).

`sample` runs, per row of a mixed batch, each stage only on the rows that need it:
1. logits processors (layers/logits_processors.py: min_tokens masking, logit_bias, penalties);
2. the allowed-token mask (`allowed_token_mask`, [num_rows, vocab] bool, True = may be sampled; None = all
   allowed): the place for per-row constraints such as structured outputs' grammar masks, applied after the
   processors and before logprobs and sampling, so logprobs describe the distribution actually sampled from;
3. logprobs of the sampled tokens (layers/logprobs.py) for rows that ask;
4. `sample_tokens` (temperature, top-k, top-p, generators).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import torch

from gpu_workers.engine.layers.logits_processors import RowHistory, apply_logits_processors
from gpu_workers.engine.layers.logprobs import token_logprobs
from scheduler.core.sampling import SamplingParams, TokenLogprob

# Below this temperature a row samples its argmax (vLLM's _SAMPLING_EPS): dividing by a smaller one can make
# inf * 0 = NaN on CUDA (a division by a scalar runs there as a multiplication by its reciprocal).
MIN_SAMPLING_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SampleResult:
    """One token per row, and its TokenLogprob where the row asked for logprobs (else None)."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None]


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    histories: list[RowHistory],
    eos_token_ids: Collection[int] = (),
    allowed_token_mask: torch.Tensor | None = None,
) -> SampleResult:
    """logits: [num_rows, vocab] fp32, finite (raw model output) -> tokens and logprobs (module doc for the
    stages). `histories`: each row's prompt + output ids (read by min_tokens and penalties only)."""
    logits = apply_logits_processors(logits, params, histories, eos_token_ids)
    if allowed_token_mask is not None:
        logits = logits.masked_fill(~allowed_token_mask, float("-inf"))
    tokens = sample_tokens(logits, params, generators)
    return SampleResult(tokens, token_logprobs(logits, params, tokens))


def sample_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """logits: [num_seqs, vocab] fp32, finite or -inf where a processor or mask ruled a token out (never a
    whole row: the runner leaves out non-finite rows) -> one token id per row."""
    greedy = logits.max(dim=-1).indices.tolist()  # = argmax (first maximum), in one faster pass on CPU
    if all(p.is_greedy for p in params):
        return greedy
    tokens = list(greedy)
    for i, p in enumerate(params):
        if p.temperature >= MIN_SAMPLING_TEMPERATURE:
            tokens[i] = _sample_one(logits[i], p, generators[i], greedy[i])
    return tokens


def _sample_one(
    logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None, argmax: int
) -> int:
    """logits: [vocab] fp32, finite. A distribution that is not one (never expected) gives the argmax: on CUDA,
    multinomial would fail with a device-side assert that kills the worker's CUDA context for every tenant."""
    logits = (logits - logits.max()) / p.temperature  # max 0: a tiny temperature cannot make +inf or NaN
    if p.top_k > 0 and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, sorted_idx = probs.sort(descending=True)
        cumulative = sorted_probs.cumsum(-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        drop = cumulative - sorted_probs >= p.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, sorted_idx, sorted_probs)
    total = float(probs.sum())
    if not math.isfinite(total) or total <= 0.0:
        return argmax
    return int(torch.multinomial(probs, 1, generator=generator).item())
