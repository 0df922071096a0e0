"""One request's state inside the engine (token ids, progress, KV pages, timings) and its share of a step."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from scheduler.core.sampling import SamplingParams


class SequenceStatus(Enum):
    """Lifecycle of a sequence."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity: one object per request (field-wise == made `seq in running` O(fields))
class Sequence:
    """Mutable per-request state owned by the engine thread.

    Invariants: `token_ids = prompt + outputs`; tokens [0, num_computed_tokens) have KV in `block_table`;
    len(block_table) * block_size >= num_computed_tokens; `block_table[:num_cached_blocks]` are prefix-cache
    blocks the sequence references (owned by `PrefixCache`), the rest are its own pages.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    adapter_id: str | None
    max_tokens: int
    predicted_output_tokens: int | None = None  # None: max_tokens (until a predictor fills it)
    tenant_id: str | None = (
        None  # who sent it (fair share between tenants); None: not known (direct engine use)
    )
    tenant_weight: float = 1.0  # its tenant's fair-share weight (scheduler/admission/fair_share.py)
    cache_namespace: str | None = None  # prefix-cache namespace: blocks are shared only within one namespace
    arrival_time: float = field(default_factory=time.time)
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    error: str | None = None  # why the engine stopped it (finish_reason "error")
    error_code: str | None = None  # with error: "adapter_unavailable", "numeric_overflow"
    first_scheduled_time: float | None = None  # the first step that ran any of its tokens (engine clock)
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    # the sum of its sampled tokens' logprobs when sampling_params.needs_cumulative_logprob, else None
    cumulative_logprob: float | None = None
    # Detokenization state.
    output_text: str = ""
    detok_offsets: tuple[int, int] = (0, 0)  # (prefix_offset, read_offset) into output ids
    num_emitted_chars: int = 0
    num_emitted_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        if self.cumulative_logprob is None and self.sampling_params.needs_cumulative_logprob:
            self.cumulative_logprob = 0.0

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the original prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens."""
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens so far."""
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """Generated token ids."""
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose KV is not yet in the cache (prompt chunks left, or the last sampled token)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        """True once a finish reason is set."""
        return self.status is SequenceStatus.FINISHED


@dataclass(frozen=True)
class BatchEntry:
    """One sequence's share of a step: compute tokens [num_computed_tokens, + num_new_tokens)."""

    seq: Sequence
    num_new_tokens: int

    @property
    def is_sampling(self) -> bool:
        """True when this step computes the sequence's last uncomputed token (so a new token is sampled)."""
        seq = self.seq
        return seq.num_computed_tokens + self.num_new_tokens == len(seq.token_ids)  # seq.num_tokens
