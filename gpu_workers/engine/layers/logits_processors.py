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
        apply_penalties(logits, penalised, [params[i] for i in penalised], [histories[i] for i in penalised])
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
    logits: torch.Tensor, rows: list[int], params: list[SamplingParams], histories: list[RowHistory]
) -> None:
    """In place: vLLM's apply_penalties on `rows` of logits [num_rows, vocab] (contiguous).

    Sparse: only the tokens a row has seen are read and written (one flat gather and scatter over the
    batch's histories), so the cost follows the histories' lengths, not the vocabulary's size."""
    vocab = logits.shape[-1]
    device = logits.device
    flat_ids = [t for h in histories for t in h.token_ids]
    row_of = [row for row, h in zip(rows, histories) for _ in h.token_ids]
    is_output = [p >= h.num_prompt_tokens for h in histories for p in range(len(h.token_ids))]
    ids = torch.tensor(flat_ids, dtype=torch.long)
    in_vocab = ids < vocab  # ids past the logits (never expected) are dropped, not folded into another row
    # [num_history_tokens] row * vocab + token: one id per (row, token), an index into the flat logits
    keys = (torch.tensor(row_of, dtype=torch.long) * vocab + ids)[in_vocab].to(device)
    seen, inverse = torch.unique(keys, return_inverse=True)  # [num_seen] ascending
    output_counts = torch.zeros(seen.shape[0], dtype=logits.dtype, device=device)
    output_counts.index_add_(0, inverse, torch.tensor(is_output, dtype=logits.dtype)[in_vocab].to(device))
    per_row = torch.zeros(3, logits.shape[0], dtype=logits.dtype)  # [3, num_rows] the rows' penalties
    per_row[:, rows] = torch.tensor(
        [[p.repetition_penalty, p.frequency_penalty, p.presence_penalty] for p in params], dtype=logits.dtype
    ).T
    repetition, frequency, presence = per_row.to(device)[:, seen // vocab]  # each [num_seen]
    flat = logits.view(-1)
    values = flat[seen]
    values = torch.where(values > 0, values / repetition, values * repetition)
    flat[seen] = values - frequency * output_counts - presence * output_counts.gt(0).to(logits.dtype)
