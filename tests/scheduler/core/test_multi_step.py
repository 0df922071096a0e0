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
from scheduler.core.executor import CopyResult, PrepareResult
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
