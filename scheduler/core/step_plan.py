"""The plain result of one `BatchScheduler.schedule()` call, which the engine carries out in order:
evict adapters, copy the moved KV pages, start the adapter loads, then run the entries (preemptions are
already reflected in the queues)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.page_compaction import compose_moves
from scheduler.core.sequence import BatchEntry


@dataclass(frozen=True)
class AdapterLoad:
    """Start loading an adapter to the device: preparing its host copy (read, validate, pack) and then copying
    it, both off the step loop (the host copy is ready in a later step; the copy lands in a later step or
    between two layers of one)."""

    adapter_id: str
    host_path: str | None


@dataclass
class StepPlan:
    """One step's work.

    `adapter_evictions`: adapters whose device copy the engine drops first (their pages are already free
    in the pool); `adapter_loads`: loads to start (pages already reserved; the engine reports each with
    `BatchScheduler.on_adapter_prepared` when its host copy is ready, `on_adapter_loaded` when it lands, or
    `on_adapter_load_failed`); `entries`: sorted by adapter
    (tokens of one adapter contiguous); `preemptions`: request ids sent back to waiting this step.

    CPU-assisted prefill: `host_assisted_adapters` are adapters still COPYING whose entries (prefill chunks
    only, one CPU worker each) run this step with their LoRA delta computed from the host copy until the
    device copy lands; `copy_waits` are request ids skipped this step because their adapter is still
    PREPARING (no host copy yet), or COPYING and they cannot run on the host copy (a decode, no CPU
    assistance, or every CPU worker taken).

    `kv_block_moves`: KV pages the pool moved out of the way of an adapter load's run (unified pool,
    scheduler/core/page_compaction.py), (old page, new page), distinct pages: block tables already name the
    new page, so the executor copies each page's K and V in every layer before anything else of the step
    (before the adapter is written into the old pages and before attention reads the new ones).

    `start_time`: the scheduler's clock when `schedule()` planned the step (when its entries start running).

    `num_steps`: the engine steps this plan runs (a multi-step window of decodes, core/multi_step.py; 1: this
    step only); `schedule()` returns the same plan for each of them, with `start_time` of that step.
    """

    entries: list[BatchEntry] = field(default_factory=list)
    adapter_loads: list[AdapterLoad] = field(default_factory=list)
    adapter_evictions: list[str] = field(default_factory=list)
    preemptions: list[str] = field(default_factory=list)
    host_assisted_adapters: set[str] = field(default_factory=set)
    copy_waits: list[str] = field(default_factory=list)
    kv_block_moves: list[tuple[int, int]] = field(default_factory=list)
    start_time: float = 0.0
    num_steps: int = 1

    def add_kv_block_moves(self, moves: list[tuple[int, int]]) -> None:
        """Add moves made after this plan's earlier ones (a page moved twice goes once, to where it ends)."""
        if moves:
            self.kv_block_moves = compose_moves(self.kv_block_moves, moves)

    def runnable_entries(self) -> list[BatchEntry]:
        """The entries whose sequence is still unfinished (a failed adapter copy ends its requests between
        `schedule()` and the step): what the executor runs and `BatchScheduler.update_from_output` updates."""
        return [e for e in self.entries if not e.seq.is_finished]

    @property
    def num_batched_tokens(self) -> int:
        """Tokens computed by this step."""
        return sum(e.num_new_tokens for e in self.entries)

    def num_output_tokens_by_request(self) -> dict[str, int]:
        """The output tokens this plan computes per request id: one per sampling entry (a decode, or a
        prompt's last chunk, whose step samples the first output token)."""
        return {e.seq.request_id: 1 for e in self.entries if e.is_sampling}
