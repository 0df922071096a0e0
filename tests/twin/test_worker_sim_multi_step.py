"""The twin's multi-step windows (scheduler/core/multi_step.py, twin/worker_sim.py TWIN_SCHEDULER_STEPS) change
no record: a worker and a cluster replay the same trace with a plan per step and with windows, and every
request's tokens, token times, finish and queueing are equal (exactly: the same float additions in the same
order), under adapter copies, KV pressure and arrivals in the middle of windows."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.memory_geometry import MemoryGeometry, ModelShape
from settings import Settings
from settings.engine import EngineSettings
from tests.twin.profile_helpers import round_cost_model
from twin import worker_sim
from twin.cluster_sim import ClusterOptions, simulate_cluster
from twin.request_record import RequestRecord
from twin.trace import AdapterSpec, TraceRequest
from twin.worker_sim import SimulatedWorker

SHAPE = ModelShape(2, 64, 4, 2, 16, 176, 512, 4096)
MB = 1_000_000
DEFAULT_STEPS = worker_sim.TWIN_SCHEDULER_STEPS
ADAPTERS = [AdapterSpec(f"a{i}", rank=8 * (1 + i % 3), num_bytes=MB // 2) for i in range(6)]


def _geometry(num_kv_blocks: int) -> MemoryGeometry:
    return MemoryGeometry.plan(
        SHAPE, element_size=2, block_size=16, memory_mode="unified", kv_cache_bytes=0,
        num_kv_blocks=num_kv_blocks, adapter_cache_bytes=2 * MB, max_lora_rank=64,
    )  # fmt: skip


def _trace(num: int, rate: float, seed: int) -> list[TraceRequest]:
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(num):
        t += rng.expovariate(rate)
        adapter = rng.choice([None, *(a.adapter_id for a in ADAPTERS)])
        out.append(TraceRequest(f"r{i}", t, rng.randint(4, 200), rng.randint(1, 120), adapter, f"t{i % 3}"))
    return out


def _key(records: list[RequestRecord]) -> list[tuple[Any, ...]]:
    return [
        (r.request_id, r.worker_id, r.token_times, r.first_scheduled_s, r.finish_s, r.finish_reason)
        for r in records
    ]


def _worker_run(trace: list[TraceRequest], num_kv_blocks: int) -> tuple[list[RequestRecord], int]:
    engine = EngineSettings(max_num_seqs=8, cpu_prefill_workers=1)
    worker = SimulatedWorker(
        engine, _geometry(num_kv_blocks), round_cost_model(prepare_gbps=0.5), ADAPTERS, max_lora_rank=64
    )
    records = worker.run(trace)
    return records, worker.core.scheduler.window.num_window_steps + worker.executor.num_decode_step_calls


@pytest.mark.parametrize(("num_kv_blocks", "seed"), [(256, 0), (40, 1)])
def test_a_worker_replays_a_trace_alike_with_and_without_windows(
    monkeypatch: pytest.MonkeyPatch, num_kv_blocks: int, seed: int
) -> None:
    trace = _trace(80, rate=40.0, seed=seed)
    monkeypatch.setattr(worker_sim, "TWIN_SCHEDULER_STEPS", 1)
    single, no_windows = _worker_run(trace, num_kv_blocks)
    monkeypatch.setattr(worker_sim, "TWIN_SCHEDULER_STEPS", 64)
    multi, window_steps = _worker_run(trace, num_kv_blocks)
    assert no_windows == 0 and window_steps > 0
    assert _key(multi) == _key(single)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_kv_blocks=st.integers(12, 80),
    rate=st.sampled_from([5.0, 40.0, 200.0]),
)
def test_windows_run_at_once_change_no_record_under_any_trace(
    seed: int, num_kv_blocks: int, rate: float
) -> None:
    """Random traces, KV pressure (preemptions, windows cut short by pages) and adapter loads: the steps a
    window runs in one executor call give the records of one plan per step."""
    trace = _trace(30, rate=rate, seed=seed)
    runs = []
    for num_steps in (1, 64):
        worker_sim.TWIN_SCHEDULER_STEPS = num_steps
        try:
            runs.append(_worker_run(trace, num_kv_blocks)[0])
        finally:
            worker_sim.TWIN_SCHEDULER_STEPS = DEFAULT_STEPS
    assert _key(runs[1]) == _key(runs[0])


def test_a_cluster_replays_a_trace_alike_with_and_without_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = _trace(120, rate=60.0, seed=2)
    flat = Settings(
        engine_max_num_seqs=8, engine_cpu_prefill_workers=0, router_policy="residency_least_loaded",
        placement_interval_s=0.5, placement_bucket_s=0.5,
    )  # fmt: skip
    options = ClusterOptions(num_initial_workers=3, is_autoscaling=False, adapter_fetch_s=0.05)
    runs = []
    for num_steps in (1, 64):
        monkeypatch.setattr(worker_sim, "TWIN_SCHEDULER_STEPS", num_steps)
        result = simulate_cluster(
            trace, ADAPTERS, flat, round_cost_model(), geometry=_geometry(256), options=options
        )
        runs.append(result)
    assert _key(runs[1].records) == _key(runs[0].records)
    assert [w.stats for w in runs[1].workers] == [w.stats for w in runs[0].workers]
