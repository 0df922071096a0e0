"""The step-cost terms shared by the router's performance model and the digital twin's cost model.

Both price an engine step as a sum of linear terms over the same few counts; this module holds the terms
they share, so the LoRA work of a batch and the per-token / per-sequence costs have one definition:

    token terms = per_token * num_tokens + per_seq * num_seqs
    LoRA term   = per_token_rank * W
                  W = sum_i tokens_i * rank_i             ("sum": segmented kernels, S-LoRA MBGMV / Punica SGMV)
                      or (sum_i tokens_i) * max_i rank_i  ("max": kernels padded to the largest rank, BGMV)

over (num_tokens, rank) pairs, one per batch entry. Units are the caller's (the router: milliseconds, the
twin: microseconds). Callers add their own terms (the router an intercept; the twin a fixed cost, a floor,
attention and per-adapter terms, a multiplier) and choose which entries count: the router passes every
request of the batch (rank 0 for the base model, whose tokens still count in the "max" form's total), the
twin only the entries whose delta runs on the device. `pick_form` is the fitters' shared choice between
the two forms. Pure: no numpy, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

LoraForm = Literal["sum", "max"]
LORA_FORMS: tuple[LoraForm, ...] = ("sum", "max")
TokenRanks = Sequence[tuple[int, int]]  # (num_tokens, rank) per entry


def lora_work(token_ranks: TokenRanks, form: str) -> float:
    """Token x rank work of the entries: "sum" of tokens*rank, or ("max") total tokens x largest rank."""
    if not token_ranks:
        return 0.0
    if form == "sum":
        return float(sum(tokens * rank for tokens, rank in token_ranks))
    return float(sum(tokens for tokens, _ in token_ranks) * max(rank for _, rank in token_ranks))


def pick_form(sse: Mapping[LoraForm, float]) -> LoraForm:
    """The form with the smaller fit residual (`sse` per form); "sum" on a tie (e.g. single-rank batches,
    where both forms' W are equal)."""
    return "max" if sse["max"] < sse["sum"] * (1 - 1e-9) else "sum"


@dataclass(frozen=True)
class StepCostTerms:
    """The shared linear terms of one step's cost (module doc), in the caller's time unit."""

    per_token: float = 0.0
    per_seq: float = 0.0
    per_token_rank: float = 0.0
    lora_form: LoraForm = "sum"

    def token_cost(self, num_tokens: float, num_seqs: float) -> float:
        """per_token * num_tokens + per_seq * num_seqs."""
        return self.per_token * num_tokens + self.per_seq * num_seqs

    def lora_cost(self, token_ranks: TokenRanks) -> float:
        """per_token_rank * W of the entries in this form (0 for no entries)."""
        return self.per_token_rank * lora_work(token_ranks, self.lora_form)
