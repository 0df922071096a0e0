"""The `Executor` protocol: what carries out the engine core's plans (scheduler/core/engine_core.py).

The engine core decides (admission, pages, adapter residency, loads to start, evictions); an executor runs
a step's entries and carries out adapter loads off the step loop: it prepares an adapter's host copy (reads,
validates and packs its files) and then copies it to the device, reporting each stage as it ends. The torch
`ModelRunner` (gpu_workers/engine/model_runner.py) is one executor; the digital twin's `SimulatedExecutor`
(twin/) is another, whose steps take the time a cost model says. Both serve the same `EngineCore`, so the
twin runs the engine's own scheduling code.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from scheduler.core.engine_stats import ExecutorStats
from scheduler.core.memory_geometry import MemoryGeometry
from scheduler.core.sequence import BatchEntry


@dataclass(frozen=True)
class PrepareResult:
    """An adapter's host copy that became ready after `seconds` of preparation (its copy to the device follows
    on its own), or failed with `error` (no copy follows). `is_from_host_tier`: ready at once, the host tier
    held it (nothing was read or packed)."""

    adapter_id: str
    seconds: float
    error: str | None = None
    is_from_host_tier: bool = False


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

    def move_kv_blocks(self, moves: list[tuple[int, int]]) -> None:
        """Copy each (old, new) page's K and V in every layer from old to new (distinct pages; the core moved
        them out of an adapter load's run, StepPlan.kv_block_moves); done before this method returns as far as
        any later step, adapter copy or adapter write is concerned."""
        ...

    def start_adapter_copy(self, adapter_id: str, host_path: str | None, page_ids: list[int]) -> None:
        """Start loading an adapter into its reserved pages, off the step loop: prepare its host copy (from
        `host_path`'s files, or the host tier), then copy it. Never waits on the files; a failure of either
        stage is reported by `take_prepared_copies` or `take_finished_copies`."""
        ...

    def take_prepared_copies(self) -> list[PrepareResult]:
        """Remove and return the host copies that became ready, or failed, since the last call (a failed
        preparation is reported here only)."""
        ...

    def take_finished_copies(self) -> list[CopyResult]:
        """Remove and return the copies that landed or failed since the last call (only of loads whose
        preparation `take_prepared_copies` already returned)."""
        ...

    def has_copies_in_flight(self) -> bool:
        """True while a started load (preparing or copying) has not been taken by `take_finished_copies`."""
        ...

    def wait_for_copy(self, timeout_s: float) -> None:
        """Block until some preparation or copy finished or `timeout_s` passed (nothing else to run)."""
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


@dataclass(frozen=True)
class DecodeSteps:
    """Decode steps run in one call: the core clock at each step's end, and each row's tokens (one per step,
    in the entries' order)."""

    end_times: list[float]
    tokens: list[list[int]]


@runtime_checkable
class DecodeStepsExecutor(Protocol):
    """An executor that can run several decode steps of one batch in a call (the twin's, which prices them;
    the core uses it for a multi-step window whose finishes are known, scheduler/core/multi_step.py)."""

    def run_decode_steps(self, entries: list[BatchEntry], max_steps: int, horizon: float) -> DecodeSteps:
        """Run 1 to `max_steps` decode steps of `entries` (one token per row per step, none fails), stopping
        after the first whose end reaches `horizon` or an adapter load's next stage."""
        ...
