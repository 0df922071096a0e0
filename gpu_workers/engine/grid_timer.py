"""The one measuring pass of `lorahost profile`: every step of the grid, timed and described.

Both fits read the same measurement: the router's performance model (gpu_workers/engine/profiler.py, CaraServe's
prefill and decode latencies by rank) and the digital twin's step coefficients
(gpu_workers/engine/twin_profiler.py). Per repeat, batch size and prompt length, each of the grid's rank mixes
is queued (one request per slot: `rank-<r>` adapters, None for the base model) and its prefill step and
`num_decode_steps` decode steps are timed; with `twin_batches` also (batches of 2+) one adapter per request
(the `rank-<low>-copy-<i>` and `mixed-copy-<i>` ids twin_profiler loads) and, after each batch's decode steps,
a mixed step (one new prompt prefilling while the batch decodes) when the engine has a slot for it.

Each step is recorded as the core's own `StepShape` (captured when `BatchScheduler.schedule()` returns,
before the step updates the sequences) with the engine step's wall time (less the recorder's own time to
describe the step) and the time `schedule()` took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scheduler.core.engine_request import EngineRequest
from twin.step_shape import StepShape

if TYPE_CHECKING:
    from gpu_workers.engine.profile_grid import ProfileGrid


@dataclass(frozen=True)
class TimedStep:
    """One engine step: its shape, its wall seconds and the seconds `schedule()` took within them."""

    shape: StepShape
    seconds: float
    schedule_seconds: float


@dataclass(frozen=True)
class TimedBatch:
    """One queued batch's timed steps: the prefill, the decode steps, then (twin batches) the mixed step.
    `ranks` is the rank of each request (0 = base model) when the batch is one of the grid's rank mixes,
    None for the twin's distinct-adapter batches."""

    num_tokens: int
    ranks: tuple[int, ...] | None
    steps: tuple[TimedStep, ...]


class StepRecorder:
    """Wraps an engine's `scheduler.schedule` to record each plan's StepShape and the time schedule() took."""

    def __init__(self, engine: Any, ranks: dict[str, int]) -> None:
        self.engine, self.ranks = engine, ranks
        self.shape = StepShape()
        self.schedule_seconds = 0.0
        self.describe_seconds = 0.0
        self._schedule = engine.scheduler.schedule
        engine.scheduler.schedule = self._recording_schedule

    def _recording_schedule(self) -> Any:
        started = time.perf_counter()
        plan = self._schedule()
        scheduled = time.perf_counter()
        self.schedule_seconds = scheduled - started
        self.shape = StepShape.of(plan.entries, self.ranks, plan.host_assisted_adapters)
        self.describe_seconds = time.perf_counter() - scheduled
        return plan

    def timed_step(self) -> TimedStep:
        """Run one engine step: its shape, its seconds (without the recorder's own) and its scheduling time."""
        self.describe_seconds = 0.0
        started = time.perf_counter()
        self.engine.step()
        seconds = time.perf_counter() - started - self.describe_seconds
        return TimedStep(self.shape, seconds, self.schedule_seconds)

    def close(self) -> None:
        """Give the engine its own schedule() back."""
        self.engine.scheduler.schedule = self._schedule


def time_grid(
    engine: Any, grid: ProfileGrid, ranks: dict[str, int], *, twin_batches: bool = False
) -> list[TimedBatch]:
    """`grid.num_repeats` passes over the grid (module doc) on `engine`, whose adapters `ranks` (id -> rank)
    are loaded; every batch's timed steps, in grid order within each pass."""
    recorder = StepRecorder(engine, ranks)
    timed: list[TimedBatch] = []
    try:
        for _ in range(grid.num_repeats):
            timed += _run_grid(engine, recorder, grid, twin_batches)
    finally:
        recorder.close()
    return timed


def run_untimed(engine: Any, grid: ProfileGrid, adapters: list[str | None], num_tokens: int) -> None:
    """Queue one request per adapter, run its prefill and decode steps, abort them (a warm-up)."""
    params = grid_params(grid)
    request_ids = [
        add_grid_request(engine, params, adapter, num_tokens, i) for i, adapter in enumerate(adapters)
    ]
    for _ in range(1 + grid.num_decode_steps):
        engine.step()
    abort_grid_requests(engine, request_ids)


def _run_grid(engine: Any, recorder: StepRecorder, grid: ProfileGrid, twin_batches: bool) -> list[TimedBatch]:
    low = min(grid.ranks)
    timed: list[TimedBatch] = []
    for batch_size in grid.batch_sizes:
        for num_tokens in grid.prompt_tokens:
            batches: list[tuple[tuple[int, ...] | None, list[str | None]]] = [
                (mix, [f"rank-{r}" if r else None for r in mix]) for mix in grid.rank_mixes(batch_size)
            ]
            if twin_batches and batch_size > 1:
                batches.append((None, [f"rank-{low}-copy-{i}" for i in range(batch_size)]))
                batches.append((None, [f"mixed-copy-{i}" for i in range(batch_size)]))
            for mix, adapters in batches:
                steps = _run_batch(engine, recorder, grid, adapters, num_tokens, twin_batches)
                timed.append(TimedBatch(num_tokens, mix, steps))
    return timed


def _run_batch(
    engine: Any,
    recorder: StepRecorder,
    grid: ProfileGrid,
    adapters: list[str | None],
    num_tokens: int,
    mixed_step: bool,
) -> tuple[TimedStep, ...]:
    """Prefill one request per adapter, decode, then (`mixed_step`) add one prompt to the decoding batch when
    the engine has a slot for it; abort them all."""
    params = grid_params(grid)
    request_ids = [
        add_grid_request(engine, params, adapter, num_tokens, i) for i, adapter in enumerate(adapters)
    ]
    timed = [recorder.timed_step() for _ in range(1 + grid.num_decode_steps)]
    if mixed_step and len(adapters) < engine.config.max_num_seqs:
        request_ids.append(add_grid_request(engine, params, adapters[0], num_tokens, len(adapters)))
        timed.append(recorder.timed_step())
    abort_grid_requests(engine, request_ids)
    return tuple(timed)


def grid_params(grid: ProfileGrid) -> Any:
    """Greedy sampling for `num_decode_steps` tokens and a few more (the grid's requests never stop early)."""
    from scheduler.core.sampling import SamplingParams

    return SamplingParams(max_tokens=grid.num_decode_steps + 4, temperature=0.0, ignore_eos=True)


def add_grid_request(engine: Any, params: Any, adapter: str | None, num_tokens: int, i: int) -> str:
    """Queue one request of a fresh `num_tokens`-token prompt (unique_prompt) for `adapter`; its id."""
    from gpu_workers.engine.profile_grid import unique_prompt

    request_id = f"profile-{time.perf_counter_ns()}-{i}"
    engine.add_request(EngineRequest(request_id, tuple(unique_prompt(num_tokens, i)), params, adapter))
    return request_id


def abort_grid_requests(engine: Any, request_ids: list[str]) -> None:
    """Abort the requests and run one step to collect their outputs."""
    for request_id in request_ids:
        engine.abort(request_id)
    engine.step()  # collect the aborted outputs
