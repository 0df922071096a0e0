"""The `Executor` protocol: what carries out the engine core's plans (scheduler/core/engine_core.py).

The engine core decides (admission, pages, adapter residency, copies to start, evictions); an executor runs
a step's entries and moves adapter copies. The torch `ModelRunner` (gpu_workers/engine/model_runner.py) is
one executor; the digital twin's `SimulatedExecutor` (twin/) is another, whose steps take the
time a cost model says. Both serve the same `EngineCore`, so the twin runs the engine's own scheduling code.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol

from scheduler.core.engine_stats import ExecutorStats
from scheduler.core.memory_geometry import MemoryGeometry
from scheduler.core.sequence import BatchEntry


@dataclass(frozen=True)
class CopyResult:
    """An adapter copy to the device that ended: it landed after `seconds`, or failed with `error`."""

    adapter_id: str
    seconds: float
    error: str | None = None


class Executor(Protocol):
    """Runs steps and adapter copies for one engine core (module doc)."""

    @property
    def geometry(self) -> MemoryGeometry:
        """The device memory's paging (the engine core sizes its page pool from it)."""
        ...

    def run_step(self, entries: list[BatchEntry], host_assisted: AbstractSet[str]) -> list[int | None]:
        """Run one step's entries (sorted by adapter) -> one sampled token per sampling entry, None for a
        row that could not be sampled (non-finite logits). Entries of a `host_assisted` adapter (still
        copying) get their LoRA delta from its host copy until the device copy lands."""
        ...

    def start_adapter_copy(self, adapter_id: str, host_path: str | None, page_ids: list[int]) -> None:
        """Start copying an adapter's host copy into its reserved pages (asynchronous); raises when the
        copy cannot start (its files changed or vanished)."""
        ...

    def take_finished_copies(self) -> list[CopyResult]:
        """Remove and return the copies that landed or failed since the last call."""
        ...

    def has_copies_in_flight(self) -> bool:
        """True while a started copy has not been taken by `take_finished_copies`."""
        ...

    def wait_for_copy(self, timeout_s: float) -> None:
        """Block until some copy finished or `timeout_s` passed (nothing else to run)."""
        ...

    def drop_adapter(self, adapter_id: str) -> None:
        """Cancel the adapter's copy and drop its device copy (the core already freed its pages)."""
        ...

    def release_request(self, request_id: str) -> None:
        """Drop per-request state (a finished request)."""
        ...

    def stats(self) -> ExecutorStats:
        """What the executor itself measures (copies, host tier, kernels): an `ExecutorStats` subclass."""
        ...
