"""`SimulatedExecutor`: the digital twin's `Executor` (scheduler/core/executor.py). It runs no model: a step
takes the time the cost model gives its `StepShape` (the simulated clock moves by that much) and samples a
fixed token. Adapter loads run off the step loop, as in the engine (gpu_workers/engine/adapter_copier.py):
one preparer makes the host copies (read, validate, pack: the cost model's prepare time) one after another,
unless the host tier (scheduler/core/host_tier.py, the engine's own) still holds the copy; one link copies
them one after another, each from the moment its host copy is ready (in that order: a host-tier hit does not
wait behind preparations), taking the cost model's copy time. The core hears of a host copy ready and of a
copy landed when the clock reaches them. KV pages moved out of an adapter's run are copied on the device
before the step (the cost model's device copy time). The engine core above it is the engine's own
(scheduler/core/)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

from scheduler.core.engine_stats import ExecutorStats
from scheduler.core.executor import CopyResult, DecodeSteps, PrepareResult
from scheduler.core.host_tier import HostTier
from scheduler.core.memory_geometry import MemoryGeometry
from scheduler.core.sequence import BatchEntry
from twin.cost_model import CostModel
from twin.sim_clock import SimClock
from twin.step_shape import StepShape

SAMPLED_TOKEN = 1  # what every simulated row samples (requests replay known lengths with ignore_eos)


@dataclass
class _Load:
    """One adapter's load: host copy ready at `prepared_at` (after `prepare_seconds`; at once from the host
    tier), then copied over the link from `started_at` to `done_at` (planned by `_schedule_link`)."""

    order: int
    prepared_at: float
    prepare_seconds: float
    copy_seconds: float
    is_from_host_tier: bool
    started_at: float | None = None
    done_at: float = 0.0
    is_prepare_taken: bool = False

    def has_started(self, now: float) -> bool:
        """True once its copy holds the link (it keeps it until `done_at`)."""
        return self.started_at is not None and self.started_at <= now


class SimulatedExecutor:
    """Steps and adapter loads in simulated time (module doc). `ranks` and `adapter_bytes`: per adapter id,
    what the cost model and the load times need (the twin registers each adapter with both). `max_lora_rank`:
    the largest adapter rank the simulated engine serves, published in its stats as the model runner publishes
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
        self._loads: dict[str, _Load] = {}
        self._num_loads_started = 0
        self._preparer_free_at = 0.0
        self._link_free_at = 0.0  # the end of the last copy that started and left `_loads`
        self.num_steps = 0
        self.busy_seconds = 0.0
        self.num_copies = 0
        self.copy_seconds = 0.0
        self.num_results_taken = 0  # host copies ready and copies landed reported to the core
        self.num_decode_step_calls = 0  # `run_decode_steps` calls (multi-step windows run at once)
        self.num_kv_block_moves = 0
        self.kv_move_seconds = 0.0
        # the last window's rows, their adapters' ranks and one step's price (`_flat_decode_seconds`)
        self._flat_price: tuple[list[BatchEntry], tuple[int, ...], float] | None = None

    @property
    def geometry(self) -> MemoryGeometry:
        """The simulated device's paging."""
        return self._geometry

    def run_step(self, entries: list[BatchEntry], host_assisted: AbstractSet[str]) -> list[int | None]:
        """Advance the clock by the step's cost; one token per sampling entry. The host-assisted part lasts
        until the last of those adapters' copies lands at most (the engine switches to a landed device copy
        between layers)."""
        shape = StepShape.of(entries, self.ranks, host_assisted)
        landing = [self._loads[a].done_at for a in host_assisted if a in self._loads]
        max_host = max(landing) - self.clock() if landing else None
        seconds = self._beside_preparer(self.cost_model.step_seconds(shape, max_host), self.clock())
        self.clock.advance(seconds)
        self.num_steps += 1
        self.busy_seconds += seconds
        return [SAMPLED_TOKEN for e in entries if e.is_sampling]

    def run_decode_steps(self, entries: list[BatchEntry], max_steps: int, horizon: float) -> DecodeSteps:
        """Up to `max_steps` decode steps of `entries` (a multi-step window, no host-assisted row), each priced
        as `run_step` prices it (the rows' context one token longer per step), until a step's end reaches
        `horizon` or the next host copy ready or copy landing."""
        self.num_decode_step_calls += 1
        transfer = self.next_transfer_at()
        limit = horizon if transfer is None else min(horizon, transfer)
        grows = self.cost_model.step_cost.per_decode_context_token_us != 0
        if grows:
            shape = StepShape.of(entries, self.ranks)
            seconds = self.cost_model.step_seconds(shape)
        else:
            seconds = self._flat_decode_seconds(entries)
        ends: list[float] = []
        now, busy = self.clock(), self.busy_seconds  # advanced step by step, as one `run_step` per step
        for step in range(max_steps):
            if grows and step:
                context = shape.decode_context_tokens + step * shape.num_decode_seqs
                seconds = self.cost_model.step_seconds(replace(shape, decode_context_tokens=context))
            if seconds < 0:
                raise ValueError(f"a step cannot take negative time ({seconds} s)")
            took = self._beside_preparer(seconds, now)
            now += took
            busy += took
            ends.append(now)
            if now >= limit:
                break
        self.clock.advance_to(now)
        self.num_steps += len(ends)
        self.busy_seconds = busy
        row = [SAMPLED_TOKEN] * len(ends)
        return DecodeSteps(ends, [row] * len(entries))

    def _flat_decode_seconds(self, entries: list[BatchEntry]) -> float:
        """One decode step's price when it does not grow with the context: `run_step`'s price, the same for
        the same rows of the same ranks, so a window cut at several horizons prices its steps once."""
        ranks = tuple([self.ranks.get(e.seq.adapter_id, 0) if e.seq.adapter_id else 0 for e in entries])
        last = self._flat_price
        is_same_rows = last is not None and len(last[0]) == len(entries) and last[1] == ranks
        if last is not None and is_same_rows and all(map(operator.is_, last[0], entries)):
            return last[2]
        seconds = self.cost_model.step_seconds(StepShape.of(entries, self.ranks))
        self._flat_price = (entries, ranks, seconds)
        return seconds

    def _beside_preparer(self, seconds: float, now: float) -> float:
        """A step of `seconds` (its price) starting at `now`: slowed by the cost model's prepare_step_factor
        while the preparer works (until `_preparer_free_at`; preparations run back to back), at its price
        after."""
        factor = self.cost_model.prepare_step_factor
        busy_s = self._preparer_free_at - now
        if factor == 1.0 or busy_s <= 0:
            return seconds
        if seconds * factor <= busy_s:
            return seconds * factor
        return busy_s + (seconds - busy_s / factor)

    def move_kv_blocks(self, moves: list[tuple[int, int]]) -> None:
        """Advance the clock by the device copy of the moved KV pages (the step after it waits for it)."""
        seconds = self.cost_model.device_copy_seconds(len(moves) * self._geometry.kv_bytes_per_block)
        self.clock.advance(seconds)
        self.busy_seconds += seconds
        self.num_kv_block_moves += len(moves)
        self.kv_move_seconds += seconds

    def start_adapter_copy(self, adapter_id: str, host_path: str | None, page_ids: list[int]) -> None:
        """Queue the load: the host copy from the host tier at once, else on the preparer when it is free
        (the cost model's prepare time); then the copy over the link (the step loop does not wait)."""
        num_bytes = self.adapter_bytes[adapter_id]
        now = self.clock()
        is_from_host_tier = self.host_tier.lookup(adapter_id)
        prepare_seconds, prepared_at = 0.0, now
        if not is_from_host_tier:
            prepare_seconds = self.cost_model.prepare_seconds(num_bytes)
            prepared_at = self._preparer_free_at = max(now, self._preparer_free_at) + prepare_seconds
        self._num_loads_started += 1
        self._loads[adapter_id] = _Load(
            self._num_loads_started,
            prepared_at,
            prepare_seconds,
            self.cost_model.copy_seconds(num_bytes),
            is_from_host_tier,
        )
        self._schedule_link()

    def _schedule_link(self) -> None:
        """(Re)plan the copies that have not started by now: one at a time, in the order their host copies
        became ready, each once its host copy is ready and the link is free."""
        now = self.clock()
        started = [load for load in self._loads.values() if load.has_started(now)]
        free_at = max([self._link_free_at, *(load.done_at for load in started)])
        pending = [load for load in self._loads.values() if not load.has_started(now)]
        for load in sorted(pending, key=lambda load: (load.prepared_at, load.order)):
            load.started_at = max(load.prepared_at, free_at)
            load.done_at = free_at = load.started_at + load.copy_seconds

    def take_prepared_copies(self) -> list[PrepareResult]:
        """The host copies the clock has reached (kept in the host tier, as the engine does)."""
        if not self._loads:
            return []
        now = self.clock()
        ready = [
            (a, load)
            for a, load in self._loads.items()
            if not load.is_prepare_taken and load.prepared_at <= now
        ]
        self.num_results_taken += len(ready)
        for adapter_id, load in ready:
            load.is_prepare_taken = True
            if not load.is_from_host_tier:
                self.host_tier.add(adapter_id, self.adapter_bytes[adapter_id])
        return [
            PrepareResult(a, load.prepare_seconds, is_from_host_tier=load.is_from_host_tier)
            for a, load in ready
        ]

    def take_finished_copies(self) -> list[CopyResult]:
        """The copies whose end the clock has reached (of loads whose host copy was reported)."""
        if not self._loads:
            return []
        now = self.clock()
        landed = [
            (a, load) for a, load in self._loads.items() if load.is_prepare_taken and load.done_at <= now
        ]
        self.num_results_taken += len(landed)
        for adapter_id, load in landed:
            del self._loads[adapter_id]
            self._link_free_at = max(self._link_free_at, load.done_at)
            self.num_copies += 1
            self.copy_seconds += load.copy_seconds
        return [CopyResult(a, load.copy_seconds) for a, load in landed]

    def has_copies_in_flight(self) -> bool:
        """True while a load (preparing or copying) has not been taken."""
        return bool(self._loads)

    def next_transfer_at(self) -> float | None:
        """When the next host copy is ready or copy lands (None when no load is in flight)."""
        return min(
            (load.done_at if load.is_prepare_taken else load.prepared_at for load in self._loads.values()),
            default=None,
        )

    def wait_for_copy(self, timeout_s: float) -> None:
        """Idle until the next host copy is ready or copy lands, at most `timeout_s`."""
        moment = self.next_transfer_at()
        if moment is not None:
            self.clock.advance_to(min(moment, self.clock() + timeout_s))

    def drop_adapter(self, adapter_id: str) -> None:
        """Forget the adapter's load (a copy under way keeps the link until its end; one not started yet
        frees its turn; the preparer's time stays taken)."""
        load = self._loads.pop(adapter_id, None)
        if load is not None and load.has_started(self.clock()):
            self._link_free_at = max(self._link_free_at, load.done_at)
        self._schedule_link()

    def release_request(self, request_id: str) -> None:
        """Nothing is kept per request."""

    def stats(self) -> SimulatedExecutorStats:
        """Copies and busy time, under the engine's stats names where they exist (the core counts the
        preparations)."""
        return SimulatedExecutorStats(
            num_adapter_copies=self.num_copies,
            adapter_copy_seconds_total=self.copy_seconds,
            busy_seconds=self.busy_seconds,
            device="twin",
            max_lora_rank=self.max_lora_rank,
        )


class SimulatedExecutorStats(ExecutorStats):
    """What the simulated executor measures: copies over the modelled link and its busy time."""

    num_adapter_copies: int = 0
    adapter_copy_seconds_total: float = 0.0
    busy_seconds: float = 0.0
    device: str = "twin"
