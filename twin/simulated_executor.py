"""`SimulatedExecutor`: the digital twin's `Executor` (scheduler/core/executor.py). It runs no model: a step
takes the time the cost model gives its `StepShape` (the simulated clock moves by that much) and samples a
fixed token; adapter copies go one after another over one link (as the engine's copier thread does) and
land when the clock reaches their end. Before a copy, the adapter's host copy is prepared in the engine
thread (the clock moves by the cost model's prepare time) unless the host tier (scheduler/core/host_tier.py,
the engine's own) still holds it. The engine core above it is the engine's own (scheduler/core/)."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from scheduler.core.engine_stats import ExecutorStats
from scheduler.core.executor import CopyResult
from scheduler.core.host_tier import HostTier
from scheduler.core.memory_geometry import MemoryGeometry
from scheduler.core.sequence import BatchEntry
from twin.cost_model import CostModel
from twin.sim_clock import SimClock
from twin.step_shape import StepShape

SAMPLED_TOKEN = 1  # what every simulated row samples (requests replay known lengths with ignore_eos)


@dataclass
class _Copy:
    started_at: float
    done_at: float


class SimulatedExecutor:
    """Steps and copies in simulated time (module doc). `ranks` and `adapter_bytes`: per adapter id, what
    the cost model and the copy time need (the twin registers each adapter with both). `max_lora_rank`: the
    largest adapter rank the simulated engine serves, published in its stats as the model runner publishes
    its own (production resolves it with `Settings.resolved_max_lora_rank`)."""

    def __init__(
        self,
        geometry: MemoryGeometry,
        cost_model: CostModel,
        clock: SimClock,
        ranks: Mapping[str, int],
        adapter_bytes: Mapping[str, int],
        host_tier: HostTier | None = None,
        *,
        max_lora_rank: int,
    ) -> None:
        self._geometry = geometry
        self.max_lora_rank = max_lora_rank
        self.cost_model = cost_model
        self.clock = clock
        self.ranks = ranks
        self.adapter_bytes = adapter_bytes
        self.host_tier = host_tier if host_tier is not None else HostTier(0)
        self._copies: dict[str, _Copy] = {}
        self._link_free_at = 0.0
        self.num_steps = 0
        self.busy_seconds = 0.0
        self.num_copies = 0
        self.copy_seconds = 0.0
        self.prepare_seconds = 0.0

    @property
    def geometry(self) -> MemoryGeometry:
        """The simulated device's paging."""
        return self._geometry

    def run_step(self, entries: list[BatchEntry], host_assisted: AbstractSet[str]) -> list[int | None]:
        """Advance the clock by the step's cost; one token per sampling entry. The host-assisted part lasts
        until the last of those adapters' copies lands at most (the engine switches to a landed device copy
        between layers)."""
        shape = StepShape.of(entries, self.ranks, host_assisted)
        landing = [self._copies[a].done_at for a in host_assisted if a in self._copies]
        max_host = max(landing) - self.clock() if landing else None
        seconds = self.cost_model.step_seconds(shape, max_host)
        self.clock.advance(seconds)
        self.num_steps += 1
        self.busy_seconds += seconds
        return [SAMPLED_TOKEN for e in entries if e.is_sampling]

    def start_adapter_copy(self, adapter_id: str, host_path: str | None, page_ids: list[int]) -> None:
        """Prepare the host copy in the engine thread (unless the host tier has it), then queue the copy on
        the link: it starts when the link is free and takes the cost model's time."""
        num_bytes = self.adapter_bytes[adapter_id]
        if not self.host_tier.lookup(adapter_id):
            seconds = self.cost_model.prepare_seconds(num_bytes)
            self.clock.advance(seconds)
            self.busy_seconds += seconds
            self.prepare_seconds += seconds
            self.host_tier.add(adapter_id, num_bytes)
        started = max(self.clock(), self._link_free_at)
        done = started + self.cost_model.copy_seconds(num_bytes)
        self._copies[adapter_id] = _Copy(started, done)
        self._link_free_at = done

    def take_finished_copies(self) -> list[CopyResult]:
        """The copies whose end the clock has reached."""
        now = self.clock()
        landed = [(a, c) for a, c in self._copies.items() if c.done_at <= now]
        for adapter_id, copy in landed:
            del self._copies[adapter_id]
            self.num_copies += 1
            self.copy_seconds += copy.done_at - copy.started_at
        return [CopyResult(a, c.done_at - c.started_at) for a, c in landed]

    def has_copies_in_flight(self) -> bool:
        """True while a copy has not been taken."""
        return bool(self._copies)

    def next_copy_done_at(self) -> float | None:
        """When the next copy lands (None when none is in flight)."""
        return min((c.done_at for c in self._copies.values()), default=None)

    def wait_for_copy(self, timeout_s: float) -> None:
        """Idle until the next copy lands, at most `timeout_s`."""
        done_at = self.next_copy_done_at()
        if done_at is not None:
            self.clock.advance_to(min(done_at, self.clock() + timeout_s))

    def drop_adapter(self, adapter_id: str) -> None:
        """Forget the adapter's copy (the link time it already took stays taken)."""
        self._copies.pop(adapter_id, None)

    def release_request(self, request_id: str) -> None:
        """Nothing is kept per request."""

    def stats(self) -> SimulatedExecutorStats:
        """Copies and busy time, under the engine's stats names where they exist."""
        return SimulatedExecutorStats(
            num_adapter_copies=self.num_copies,
            adapter_copy_seconds_total=self.copy_seconds,
            adapter_prepare_seconds_total=self.prepare_seconds,
            busy_seconds=self.busy_seconds,
            device="twin",
            max_lora_rank=self.max_lora_rank,
        )


class SimulatedExecutorStats(ExecutorStats):
    """What the simulated executor measures: copies over the modelled link and its busy time."""

    num_adapter_copies: int = 0
    adapter_copy_seconds_total: float = 0.0
    adapter_prepare_seconds_total: float = 0.0
    busy_seconds: float = 0.0
    device: str = "twin"
