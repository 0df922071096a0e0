"""The plain result of one `BatchScheduler.schedule()` call, which the engine carries out in order:
evict adapters, load adapters, then run the entries (preemptions are already reflected in the queues)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.sequence import BatchEntry


@dataclass(frozen=True)
class AdapterLoad:
    """Copy an adapter from its host copy to the device before this step's entries run."""

    adapter_id: str
    host_path: str | None


@dataclass
class StepPlan:
    """One step's work.

    `adapter_evictions`: adapters whose device copy the engine drops first (their pages are already free
    in the pool); `adapter_loads`: adapters to copy in next (pages already reserved; the engine reports
    each with `BatchScheduler.on_adapter_loaded` or `on_adapter_load_failed`); `entries`: sorted by adapter
    (tokens of one adapter contiguous); `preemptions`: request ids sent back to waiting this step.
    """

    entries: list[BatchEntry] = field(default_factory=list)
    adapter_loads: list[AdapterLoad] = field(default_factory=list)
    adapter_evictions: list[str] = field(default_factory=list)
    preemptions: list[str] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens computed by this step."""
        return sum(e.num_new_tokens for e in self.entries)
