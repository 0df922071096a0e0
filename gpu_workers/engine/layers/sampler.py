"""Token sampling: greedy argmax, or temperature / top-k / top-p with an optional per-request generator."""

from __future__ import annotations

import math

import torch

from scheduler.core.sampling import SamplingParams

# Below this temperature a row samples its argmax (vLLM's _SAMPLING_EPS): dividing by a smaller one can make
# inf * 0 = NaN on CUDA (a division by a scalar runs there as a multiplication by its reciprocal).
MIN_SAMPLING_TEMPERATURE = 1e-5


def sample_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """logits: [num_seqs, vocab] fp32, finite (the runner leaves out non-finite rows) -> one token id per row."""
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
