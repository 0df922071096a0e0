"""Logits processors: per-row edits of a step's logits before sampling (scheduler/core/sampling.py for the
parameters and their order: min_tokens masking, logit_bias, then repetition / frequency / presence penalties,
as vLLM v1 applies them).

Each processor is vectorised over the rows that ask for it (their indices gathered once, the edit scattered
back); a row that asks for nothing costs nothing, and a batch where no row asks costs one Python pass over
the parameters. Rows never see each other's settings: every edit is indexed by its own row.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from scheduler.core.sampling import SamplingParams


@dataclass(frozen=True)
class RowHistory:
    """A row's tokens so far: `token_ids` = prompt + output, the first `num_prompt_tokens` of them the prompt."""

    token_ids: Sequence[int]
    num_prompt_tokens: int

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.num_prompt_tokens


def apply_logits_processors(
    logits: torch.Tensor,
    params: list[SamplingParams],
    histories: list[RowHistory],
    eos_token_ids: Collection[int],
) -> torch.Tensor:
    """logits: [num_rows, vocab] fp32 -> the processed logits (a new tensor when any row is edited, else the
    same one). `histories`: one per row (only rows with min_tokens or penalties read it)."""
    held = [i for i, p in enumerate(params) if p.is_stop_held(histories[i].num_output_tokens)]
    biased = [i for i, p in enumerate(params) if p.logit_bias]
    penalised = [i for i, p in enumerate(params) if p.has_penalties]
    if not (held or biased or penalised):
        return logits
    logits = logits.clone()
    if held:
        mask_stop_tokens(logits, held, [params[i] for i in held], eos_token_ids)
    if biased:
        add_logit_bias(logits, biased, [params[i] for i in biased])
    if penalised:
        rows = torch.tensor(penalised, device=logits.device)
        edited = apply_penalties(
            logits.index_select(0, rows), [params[i] for i in penalised], [histories[i] for i in penalised]
        )
        logits.index_copy_(0, rows, edited)
    return logits


def mask_stop_tokens(
    logits: torch.Tensor, rows: list[int], params: list[SamplingParams], eos_token_ids: Collection[int]
) -> None:
    """In place: -inf on each row's stop token ids (and EOS unless it ignores EOS); min_tokens's mask."""
    vocab = logits.shape[-1]
    pairs = [
        (row, token)
        for row, p in zip(rows, params)
        for token in {*p.stop_token_ids, *(() if p.ignore_eos else eos_token_ids)}
        if token < vocab
    ]
    if pairs:
        index = torch.tensor(pairs, device=logits.device).T  # [2, num_pairs]
        logits[index[0], index[1]] = float("-inf")


def add_logit_bias(logits: torch.Tensor, rows: list[int], params: list[SamplingParams]) -> None:
    """In place: each row's logit_bias added to its tokens' logits (the worker refuses ids past the vocabulary;
    any that reach here are skipped, never an index error that would fail the batch)."""
    vocab = logits.shape[-1]
    triples = [
        (row, token, value) for row, p in zip(rows, params) for token, value in p.logit_bias if token < vocab
    ]
    if not triples:
        return
    row_ids, token_ids, values = (list(t) for t in zip(*triples))
    device = logits.device
    logits.index_put_(
        (torch.tensor(row_ids, device=device), torch.tensor(token_ids, device=device)),
        torch.tensor(values, dtype=logits.dtype, device=device),
        accumulate=True,
    )


def apply_penalties(
    logits: torch.Tensor, params: list[SamplingParams], histories: list[RowHistory]
) -> torch.Tensor:
    """logits: [n, vocab] of the penalised rows -> penalised logits (vLLM's apply_penalties)."""
    num_rows, vocab = logits.shape
    device = logits.device
    prompt_mask = _token_counts(
        [h.token_ids[: h.num_prompt_tokens] for h in histories], num_rows, vocab, device
    ).gt(0)
    output_counts = _token_counts(
        [h.token_ids[h.num_prompt_tokens :] for h in histories], num_rows, vocab, device
    ).to(logits.dtype)
    output_mask = output_counts.gt(0)
    # [n, 1] per-row values
    repetition = torch.tensor([p.repetition_penalty for p in params], dtype=logits.dtype, device=device)[
        :, None
    ]
    frequency = torch.tensor([p.frequency_penalty for p in params], dtype=logits.dtype, device=device)[
        :, None
    ]
    presence = torch.tensor([p.presence_penalty for p in params], dtype=logits.dtype, device=device)[:, None]
    seen = prompt_mask | output_mask
    penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalised, logits)
    return logits - frequency * output_counts - presence * output_mask.to(logits.dtype)


def _token_counts(rows: list[Sequence[int]], num_rows: int, vocab: int, device: torch.device) -> torch.Tensor:
    """[num_rows, vocab] int32: how often each token occurs in each row (ids >= vocab are dropped)."""
    width = max((len(r) for r in rows), default=0)
    padded = torch.full((num_rows, width), vocab, dtype=torch.long)  # vocab: a padding column, dropped
    for i, row in enumerate(rows):
        if row:
            padded[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
    padded = padded.clamp_(max=vocab).to(device)
    counts = torch.zeros(num_rows, vocab + 1, dtype=torch.int32, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.int32))
    return counts[:, :vocab]
