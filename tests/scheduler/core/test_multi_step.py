"""Multi-step scheduling (scheduler/core/multi_step.py): a window of decodes changes no result. Two engine
cores fed the same arrivals, aborts and sampled tokens (stop tokens included), one planning every step and
one opening windows, give the same deltas, finishes, block tables and free pages after every step, under
KV pressure (preemptions, pages the window cannot get)."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.engine_core import CoreLimits, EngineCore
from scheduler.core.engine_stats import ExecutorStats
from scheduler.core.executor import CopyResult, DecodeSteps, PrepareResult
from scheduler.core.memory_geometry import MemoryGeometry, ModelShape
from scheduler.core.multi_step import num_window_steps
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import BatchEntry, Sequence, SequenceStatus
from scheduler.core.step_plan import StepPlan
from tests.scheduler.core.scheduler_helpers import ManualClock

SHAPE = ModelShape(2, 64, 4, 2, 16, 176, 512, 1024)
STOP = 3


class TokenExecutor:
    """Samples a token that depends only on the row's request and position (STOP for some), so both cores
    see the same tokens whatever their plans."""

    def __init__(self, geometry: MemoryGeometry, stop_every: int) -> None:
        self.geometry = geometry
        self.stop_every = stop_every
        self.num_steps = 0

    def token(self, seq: Sequence) -> int:
        position = seq.num_output_tokens + 7 * len(seq.prompt_token_ids)
        return STOP if self.stop_every and position % self.stop_every == 0 else 10 + position % 17

    def run_step(self, entries: list[BatchEntry], host_assisted: AbstractSet[str]) -> list[int | None]:
        self.num_steps += 1
        return [self.token(e.seq) for e in entries if e.is_sampling]

    def move_kv_blocks(self, moves: list[tuple[int, int]]) -> None:
        raise AssertionError("no adapters here")

    def start_adapter_copy(self, adapter_id: str, host_path: str | None, page_ids: list[int]) -> None:
        raise AssertionError("no adapters here")

    def take_prepared_copies(self) -> list[PrepareResult]:
        return []

    def take_finished_copies(self) -> list[CopyResult]:
        return []

    def has_copies_in_flight(self) -> bool:
        return False

    def wait_for_copy(self, timeout_s: float) -> None:
        pass

    def drop_adapter(self, adapter_id: str) -> None:
        pass

    def release_request(self, request_id: str) -> None:
        pass

    def stats(self) -> ExecutorStats:
        return ExecutorStats()


class TimedExecutor(TokenExecutor):
    """Moves the core's clock by 1 + 0.25 per row for each step (a simulation's executor)."""

    def __init__(self, geometry: MemoryGeometry, stop_every: int, clock: ManualClock) -> None:
        super().__init__(geometry, stop_every)
        self.clock = clock

    def run_step(self, entries: list[BatchEntry], host_assisted: AbstractSet[str]) -> list[int | None]:
        self.clock.now += 1.0 + 0.25 * len(entries)
        return super().run_step(entries, host_assisted)


class TimedDecodeStepsExecutor(TimedExecutor):
    """Also runs a window's steps in one call (`DecodeStepsExecutor`)."""

    num_calls = 0

    def run_decode_steps(self, entries: list[BatchEntry], max_steps: int, horizon: float) -> DecodeSteps:
        self.num_calls += 1
        ends: list[float] = []
        rows: list[list[int]] = [[] for _ in entries]
        while len(ends) < max_steps and (not ends or ends[-1] < horizon):
            self.clock.now += 1.0 + 0.25 * len(entries)
            ends.append(self.clock.now)
            for row, entry in zip(rows, entries):
                row.append(
                    10 + (entry.seq.num_output_tokens + len(row) + 7 * entry.seq.num_prompt_tokens) % 17
                )
        return DecodeSteps(ends, rows)


def _core(num_steps: int, num_kv_blocks: int, stop_every: int) -> tuple[EngineCore, ManualClock]:
    geometry = MemoryGeometry.plan(
        SHAPE, element_size=4, block_size=4, memory_mode="unified", kv_cache_bytes=0,
        num_kv_blocks=num_kv_blocks, max_lora_rank=8,
    )  # fmt: skip
    clock = ManualClock()
    limits = CoreLimits(
        max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=False, num_scheduler_steps=num_steps
    )
    executor = TokenExecutor(geometry, stop_every)
    core = EngineCore(executor, FifoPolicy(), limits, eos_token_ids={STOP}, clock=clock, step_timer=clock)
    return core, clock


def _seq(request_id: str, num_prompt: int, max_tokens: int, ignore_eos: bool, now: float) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
    prompt = [100 + (7 * int(request_id[1:]) + i) % 50 for i in range(num_prompt)]
    return Sequence(request_id, prompt, params, None, max_tokens, arrival_time=now)


def _timed_replay(
    executor_type: type[TimedExecutor], num_steps: int, requests: list[Any], blocks: int
) -> Any:
    """A simulation's loop (twin/worker_sim.py): step up to each event, then add its arrivals."""
    core, clock = _core(num_steps, blocks, stop_every=0)
    core.executor = core._decode_steps = None  # type: ignore[assignment]
    executor = executor_type(core.geometry, 0, clock)
    core.executor = executor
    core._decode_steps = executor if isinstance(executor, TimedDecodeStepsExecutor) else None
    trail = []
    for index in range(60):
        moment = 6.0 * index  # events 6 s apart: windows of several 1.25-2 s steps between them
        while clock.now < moment and core.has_unfinished_requests():
            deltas = core.step(horizon=moment)
            trail.append(
                [(d.seq.request_id, d.new_token_ids, d.token_times, d.seq.finish_reason) for d in deltas]
            )
        clock.now = max(clock.now, moment)
        running = [(s.request_id, list(s.block_table)) for s in core.scheduler.running]
        trail.append((moment, running, core.pool.num_free_blocks, core.counters.num_steps))
        for i, (num_prompt, max_tokens, arrival, _) in enumerate(requests):
            if arrival == index:
                core.add(_seq(f"r{i}", num_prompt, max_tokens, True, clock.now))
    return trail, executor


def _replay(num_steps: int, requests: list[Any], aborts: list[Any], blocks: int, stop_every: int) -> Any:
    core, clock = _core(num_steps, blocks, stop_every)
    trail = []
    for step in range(80):
        clock.now = float(step)
        for i, (num_prompt, max_tokens, arrival, ignore_eos) in enumerate(requests):
            if arrival == step:
                core.add(_seq(f"r{i}", num_prompt, max_tokens, ignore_eos, clock.now))
        for index, at in aborts:
            if at == step and index < len(requests):
                core.abort(f"r{index}")
        deltas = [(d.seq.request_id, d.new_token_ids, d.seq.finish_reason) for d in core.step()]
        running = [(s.request_id, list(s.block_table), s.num_computed_tokens) for s in core.scheduler.running]
        trail.append((deltas, running, core.pool.num_free_blocks, sorted(core.scheduler.waiting)))
    return trail, core


requests = st.lists(
    st.tuples(st.integers(1, 9), st.integers(1, 24), st.integers(0, 30), st.booleans()),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(
    requests=requests,
    aborts=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 40)), max_size=2),
    num_kv_blocks=st.integers(6, 24),
    stop_every=st.sampled_from([0, 5, 11]),
)
def test_windows_give_the_results_of_a_plan_per_step(
    requests: list[Any], aborts: list[Any], num_kv_blocks: int, stop_every: int
) -> None:
    single, _ = _replay(1, requests, aborts, num_kv_blocks, stop_every)
    multi, _ = _replay(8, requests, aborts, num_kv_blocks, stop_every)
    assert multi == single


@settings(max_examples=60, deadline=None)
@given(requests=requests, num_kv_blocks=st.integers(6, 24))
def test_window_steps_run_at_once_up_to_a_horizon_give_the_results_of_a_plan_per_step(
    requests: list[Any], num_kv_blocks: int
) -> None:
    """Deltas, token times, block tables (pages in the same order) and counters after every event."""
    one_by_one, _ = _timed_replay(TimedExecutor, 1, requests, num_kv_blocks)
    at_once, _ = _timed_replay(TimedDecodeStepsExecutor, 8, requests, num_kv_blocks)
    assert _merge(at_once) == _merge(one_by_one)


def test_a_window_runs_its_steps_at_once_with_a_decode_steps_executor() -> None:
    requests = [(3, 20, 0, True), (5, 12, 2, True), (2, 24, 9, True)]
    one_by_one, _ = _timed_replay(TimedExecutor, 1, requests, 10)
    at_once, executor = _timed_replay(TimedDecodeStepsExecutor, 8, requests, 10)
    assert isinstance(executor, TimedDecodeStepsExecutor) and executor.num_calls > 0
    assert _merge(at_once) == _merge(one_by_one)


def _merge(trail: list[Any]) -> list[Any]:
    """Per request: its tokens, times and finish up to each event; the event snapshots as they are."""
    out: list[Any] = []
    tokens: dict[str, tuple[list[int], list[float], str | None]] = {}
    for item in trail:
        if isinstance(item, tuple):
            out.append((item, sorted((k, list(v[0]), list(v[1]), v[2]) for k, v in tokens.items())))
            continue
        for request_id, new, times, reason in item:
            got, at, _ = tokens.get(request_id, ([], [], None))
            tokens[request_id] = (got + list(new), at + list(times), reason)
    return out


def test_a_lone_decode_runs_in_windows_and_a_new_request_ends_one() -> None:
    core, clock = _core(8, 32, stop_every=0)
    core.add(_seq("r0", 4, 20, True, 0.0))
    for step in range(6):
        clock.now = float(step)
        core.step()
    window = core.scheduler.window
    assert window.num_window_steps > 0 and window.is_open
    core.add(_seq("r1", 4, 5, True, 6.0))
    assert not window.is_open  # the next step plans in full and admits r1
    clock.now = 6.0
    core.step()
    assert [s.request_id for s in core.scheduler.running] == ["r0", "r1"]


def test_horizon_runs_the_window_until_the_timer_reaches_it() -> None:
    core, clock = _core(8, 32, stop_every=0)

    def timer() -> float:
        clock.now += 1.0
        return clock.now

    core.step_timer = timer
    core.add(_seq("r0", 4, 30, True, 0.0))
    core.step()  # the prefill, then the first decode opens a window
    deltas = core.step(horizon=clock.now + 4.5)
    times = [t for d in deltas for t in d.token_times]
    assert times == sorted(times)
    assert clock.now >= 4.5 and len(deltas) >= 2


# ---- the planning rule ----------------------------------------------------------------------------


def _decode(request_id: str, num_prompt: int, num_out: int, max_tokens: int) -> Sequence:
    seq = Sequence(
        request_id, list(range(num_prompt)), SamplingParams(max_tokens=max_tokens), None, max_tokens
    )
    seq.token_ids += [1] * num_out
    seq.num_computed_tokens = seq.num_tokens - 1
    seq.status = SequenceStatus.RUNNING
    return seq


@given(
    rows=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 30), st.integers(0, 30)), min_size=1, max_size=8
    ),
    num_waiting=st.integers(0, 2),
    max_steps=st.integers(1, 64),
    has_load=st.booleans(),
)
def test_a_window_never_crosses_a_length_finish_or_a_waiting_request(
    rows: list[tuple[int, int, int]], num_waiting: int, max_steps: int, has_load: bool
) -> None:
    running = [_decode(f"r{i}", p, out, out + left + 1) for i, (p, out, left) in enumerate(rows)]
    plan = StepPlan([BatchEntry(s, 1) for s in running])
    if has_load:
        plan.adapter_evictions.append("a")
    k = num_window_steps(plan, running, num_waiting, max_steps)
    assert 1 <= k <= max(max_steps, 1)
    assert k <= min(s.max_tokens - s.num_output_tokens for s in running)  # a length finish ends it, last
    if num_waiting or has_load or max_steps == 1:
        assert k == 1
    else:
        assert k == min(max_steps, min(s.max_tokens - s.num_output_tokens for s in running))
