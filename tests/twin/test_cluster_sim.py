"""The cluster twin on tiny timelines worked out by hand, with test_worker_sim.py's profile of round numbers: a
step costs 1 ms fixed + 0.1 ms per prefill token + 0.5 ms per decode row, an adapter copy of 1 MB takes 0.5 s
(2 MB/s link); fetching an adapter's files to a worker takes 0.1 s here. Plus a hypothesis property over
random traces: every request finishes once, on one worker, and no worker runs more than max_num_seqs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.worker_view import worker_view
from scheduler.core.memory_geometry import MemoryGeometry, ModelShape
from settings import Settings
from tests.twin.profile_helpers import round_cost_model
from twin.cluster_sim import ClusterOptions, ClusterResult, ClusterSim, simulate_cluster
from twin.request_record import RequestRecord
from twin.trace import AdapterSpec, TraceRequest

SHAPE = ModelShape(2, 64, 4, 2, 16, 176, 512, 4096)
MB = 1_000_000
PREFILL_10_S = 0.002  # 1 ms + 10 x 0.1 ms
FETCH_S = 0.1
COPY_S = 0.5
ADAPTERS = [AdapterSpec("a", rank=8, num_bytes=MB), AdapterSpec("b", rank=16, num_bytes=MB)]


GEOMETRY = MemoryGeometry.plan(
    SHAPE, element_size=2, block_size=16, memory_mode="unified", kv_cache_bytes=0, num_kv_blocks=256,
    adapter_cache_bytes=4 * MB, max_lora_rank=64,
)  # fmt: skip


def _settings(**flat: Any) -> Settings:
    defaults = {
        "engine_cpu_prefill_workers": 0,
        "engine_enable_prefix_caching": False,
        "placement_interval_s": 0,
    }
    return Settings(**(defaults | flat))


def _run(trace: list[TraceRequest], settings_: Settings, **options: Any) -> ClusterResult:
    options = {"adapter_fetch_s": FETCH_S} | options
    return simulate_cluster(
        trace, ADAPTERS, settings_, round_cost_model(), geometry=GEOMETRY, options=ClusterOptions(**options)
    )


def test_an_adapters_second_request_goes_to_the_worker_that_already_holds_it() -> None:
    trace = [
        TraceRequest("base", 0.0, num_prompt_tokens=10, num_output_tokens=100),  # tie: twin-000
        TraceRequest("a1", 0.01, num_prompt_tokens=10, num_output_tokens=1, adapter_id="a"),  # least loaded
        TraceRequest("a2", 1.0, num_prompt_tokens=10, num_output_tokens=1, adapter_id="a"),  # both idle again
    ]
    base, a1, a2 = _run(trace, _settings(), num_initial_workers=2, is_autoscaling=False).records
    assert (base.worker_id, a1.worker_id) == ("twin-000", "twin-001")
    assert a1.ttft_s == pytest.approx(FETCH_S + COPY_S + PREFILL_10_S)  # files fetched, copied, prefilled
    # both workers idle and equally loaded: residency alone sends it to twin-001 (the id tie-break would not)
    assert a2.worker_id == "twin-001"
    assert a2.ttft_s == pytest.approx(PREFILL_10_S)  # on the device already: no fetch, no copy


def test_requests_for_one_adapter_on_one_worker_share_its_fetch() -> None:
    trace = [TraceRequest(f"r{i}", 0.01 * i, 10, 1, adapter_id="a") for i in range(2)]
    first, second = _run(trace, _settings(), num_initial_workers=1, is_autoscaling=False).records
    # both wait for the one fetch (lands at 0.1) and the one copy (lands at 0.6), then prefill together
    assert first.first_scheduled_s == second.first_scheduled_s == pytest.approx(FETCH_S + COPY_S)


def _first_ttft_from_zero(cold_start_s: float) -> RequestRecord:
    trace = [TraceRequest("r", 1.9, num_prompt_tokens=10, num_output_tokens=1)]
    result = _run(
        trace, _settings(), num_initial_workers=0, cold_start_s=cold_start_s, scaling_interval_s=2.0
    )
    return result.records[0]


def test_a_cold_start_delays_the_first_request_by_cold_start_s() -> None:
    # arrives at 1.9 with no worker: held; the scaler's poll at 2.0 starts one, ready cold_start_s later; the
    # held request's poll (every 0.1 s from 1.9) routes it at that moment
    short, long = _first_ttft_from_zero(10.0), _first_ttft_from_zero(20.0)
    assert short.ttft_s == pytest.approx(0.1 + 10.0 + PREFILL_10_S)
    assert long.ttft_s - short.ttft_s == pytest.approx(10.0)  # type: ignore[operator]
    assert short.worker_id == "twin-000"


def test_scales_to_zero_when_idle_and_back_from_zero_with_another_cold_start() -> None:
    trace = [TraceRequest("early", 0.5, 10, 1), TraceRequest("late", 100.0, 10, 1)]
    result = _run(trace, _settings(scale_to_zero_idle_s=5), num_initial_workers=0, cold_start_s=10.0)
    early, late = result.records
    assert early.ttft_s == pytest.approx(1.5 + 10.0 + PREFILL_10_S)  # scaler at 2.0, ready at 12.0
    # late arrives at 100.0 after the scale-to-zero; the scaler polls at 100.0 first (nothing waits yet), then
    # at 102.0: ready at 112.0
    assert late.ttft_s == pytest.approx(2.0 + 10.0 + PREFILL_10_S)
    assert (early.worker_id, late.worker_id) == ("twin-000", "twin-001")
    counts = [(c.num_ready, c.num_starting) for c in result.worker_counts]
    assert counts == [(0, 0), (0, 1), (1, 0), (0, 0), (0, 1), (1, 0)]
    assert result.workers[0].stopped_s is not None and result.workers[1].stopped_s is None


def test_a_request_no_worker_takes_is_refused_after_the_cold_start_timeout() -> None:
    trace = [TraceRequest("r", 0.0, 10, 1)]
    result = _run(trace, _settings(cold_start_timeout_s=3), num_initial_workers=0, is_autoscaling=False)
    [record] = result.records
    assert record.worker_id is None and record.error_code == "cold_start_timeout"
    assert record.finish_s == pytest.approx(3.0)


def test_routing_follows_the_placement_computed_from_recorded_demand_over_residency() -> None:
    # a1 and b1 both go to twin-000 (idle workers tie on load while a1's files are fetched); the placement at
    # 1 s sees equal demand for "a" (rank 8) and "b" (rank 16) and gives each its own worker, so the second
    # requests follow the table although twin-000 holds both adapters
    trace = [
        TraceRequest("a1", 0.0, 10, 1, adapter_id="a"),
        TraceRequest("b1", 0.001, 10, 1, adapter_id="b"),
        TraceRequest("a2", 1.5, 10, 1, adapter_id="a"),
        TraceRequest("b2", 1.5, 10, 1, adapter_id="b"),
    ]
    settings_ = _settings(
        placement_interval_s=1.0,
        placement_bucket_s=1.0,
        placement_policy="loraserve",  # the placement and router under test (not today's defaults)
        router_policy="residency_least_loaded",
    )
    result = _run(trace, settings_, num_initial_workers=2, is_autoscaling=False)
    a1, b1, a2, b2 = result.records
    assert a1.worker_id == b1.worker_id == "twin-000"
    [table] = result.routing_tables
    assert table.version == 1 and set(table.rows) == {"a", "b"}
    [(holder_a, _)], [(holder_b, _)] = table.rows["a"], table.rows["b"]
    assert {holder_a, holder_b} == {"twin-000", "twin-001"}
    assert (a2.worker_id, b2.worker_id) == (holder_a, holder_b)


def _concurrency(records: list[RequestRecord]) -> int:
    """Most requests between their first scheduled step and their finish at any moment."""
    edges = sorted(
        [(r.first_scheduled_s, 1) for r in records if r.first_scheduled_s is not None]
        + [(r.finish_s, -1) for r in records if r.finish_s is not None]
    )
    running = peak = 0
    for _, delta in edges:  # finishes sort before starts at the same time (-1 < 1): [start, finish)
        running += delta
        peak = max(peak, running)
    return peak


_requests = st.lists(
    st.tuples(
        st.floats(0.0, 3.0, allow_nan=False),
        st.integers(1, 40),
        st.integers(1, 8),
        st.sampled_from([None, "a", "b"]),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=_requests,
    num_workers=st.integers(0, 3),
    is_autoscaling=st.booleans(),
    max_num_seqs=st.integers(1, 3),
)
def test_every_request_finishes_once_on_one_worker_within_its_batch_limit(
    requests: list[tuple[float, int, int, str | None]],
    num_workers: int,
    is_autoscaling: bool,
    max_num_seqs: int,
) -> None:
    trace = [TraceRequest(f"r{i}", t, p, o, adapter_id=a) for i, (t, p, o, a) in enumerate(requests)]
    settings_ = _settings(
        engine_max_num_seqs=max_num_seqs,
        placement_interval_s=0.5,
        placement_bucket_s=0.5,
        scale_to_zero_idle_s=1,
    )
    options = ClusterOptions(
        num_initial_workers=num_workers or (0 if is_autoscaling else 1), is_autoscaling=is_autoscaling,
        cold_start_s=0.7, scaling_interval_s=0.3, adapter_fetch_s=0.05,
    )  # fmt: skip
    sim = ClusterSim(settings_, GEOMETRY, round_cost_model(), ADAPTERS, options)
    result = sim.run(trace)
    for request, record in zip(trace, result.records):
        holders = [n.worker_id for n in sim.nodes.values() if request.request_id in n.sim.records]
        assert holders == [record.worker_id]
        assert record.finish_reason == "length" and record.num_output_tokens == request.num_output_tokens
        assert record.arrival_s == request.arrival_s
    for node in sim.nodes.values():
        # no preemption, so [first scheduled, finish) is when a request runs
        assert node.stats().scheduler.num_preemptions == 0
        assert _concurrency(list(node.sim.records.values())) <= max_num_seqs
    assert result.simulated_s_per_wall_s > 0


def test_the_twin_sizes_its_workers_for_the_rank_production_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The twin and the planner page a worker's memory for the rank its engine would serve
    (`Settings.resolved_max_lora_rank`: engine_max_lora_rank, else the upload limit), as the worker builder does;
    they read the upload limit alone before (issue 34)."""
    from gpu_workers.engine.config import EngineConfig
    from twin.profile import TwinProfile

    settings_ = _settings(engine_max_lora_rank=16, max_rank=256, engine_memory_mode="static")
    ranks: list[int] = []
    real_geometry = TwinProfile.geometry

    def spy(self: TwinProfile, *args: Any, **kwargs: Any) -> MemoryGeometry:
        ranks.append(kwargs["max_lora_rank"])
        return real_geometry(self, *args, **kwargs)

    monkeypatch.setattr(TwinProfile, "geometry", spy)
    simulate_cluster([], ADAPTERS, settings_, round_cost_model())
    production = EngineConfig.from_section(
        settings_.engine, model_path=Path("."), max_lora_rank=settings_.resolved_max_lora_rank()
    )
    assert ranks == [production.max_lora_rank] == [16]


@pytest.mark.parametrize(
    ("flat", "rank"), [({"engine_max_lora_rank": 16, "max_rank": 256}, 16), ({"max_rank": 64}, 64)]
)
def test_the_twins_workers_publish_the_rank_limit_production_resolves(
    flat: dict[str, Any], rank: int
) -> None:
    """The router reads each worker's published max_lora_rank (`serves_rank`, `rank_limit_refusal`): the twin's
    workers publish the rank production's engine gets (`Settings.resolved_max_lora_rank` -> `EngineConfig`
    -> `RunnerStats`); they published 0, "no limit", before (issue 34)."""
    from gpu_workers.engine.config import EngineConfig

    settings_ = _settings(**flat)
    production = EngineConfig.from_section(
        settings_.engine, model_path=Path("."), max_lora_rank=settings_.resolved_max_lora_rank()
    )
    trace = [TraceRequest("a1", 0.0, num_prompt_tokens=10, num_output_tokens=1, adapter_id="a")]
    [worker] = _run(trace, settings_, num_initial_workers=1, is_autoscaling=False).workers
    assert worker.stats.engine.max_lora_rank == production.max_lora_rank == rank
    assert worker_view(worker.stats).max_lora_rank == rank
