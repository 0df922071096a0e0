"""The worker twin on tiny scenarios, every time worked out by hand from a profile of round numbers: a step
costs 1 ms fixed + 0.1 ms per prefill token + 0.5 ms per decode row (nothing else), an adapter copy of
1 MB takes 0.5 s (2 MB/s link)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.engine_core import EngineCore
from scheduler.core.memory_geometry import MemoryGeometry, ModelShape
from settings.engine import EngineSettings
from tests.twin.profile_helpers import round_cost_model
from twin.simulated_executor import SimulatedExecutor, SimulatedExecutorStats
from twin.trace import AdapterSpec, TraceRequest
from twin.worker_sim import SimulatedWorker

SHAPE = ModelShape(2, 64, 4, 2, 16, 176, 512, 4096)
MB = 1_000_000


def _worker(
    adapters: list[AdapterSpec] = (),  # type: ignore[assignment]
    prepare_gbps: float | None = None,
    prepare_step_factor: float = 1.0,
    **engine: Any,
) -> SimulatedWorker:
    settings = EngineSettings(**({"cpu_prefill_workers": 0, "enable_prefix_caching": False} | engine))
    geometry = MemoryGeometry.plan(
        SHAPE, element_size=2, block_size=16, memory_mode="unified", kv_cache_bytes=0, num_kv_blocks=256,
        adapter_cache_bytes=4 * MB, max_lora_rank=64,
    )  # fmt: skip
    cost_model = round_cost_model(prepare_gbps=prepare_gbps, prepare_step_factor=prepare_step_factor)
    return SimulatedWorker(settings, geometry, cost_model, adapters, max_lora_rank=64)


def test_one_request_prefills_then_decodes_at_the_profiles_step_times() -> None:
    [record] = _worker().run([TraceRequest("r", 0.0, num_prompt_tokens=10, num_output_tokens=3)])
    # prefill 1 + 0.1*10 = 2 ms; each decode 1 + 0.5 = 1.5 ms
    assert record.token_times == pytest.approx([0.002, 0.0035, 0.005])
    assert record.ttft_s == pytest.approx(0.002) and record.finish_s == pytest.approx(0.005)
    assert record.queueing_s == 0.0 and record.finish_reason == "length"


def test_a_request_arriving_mid_step_joins_the_next_step_with_the_running_decode() -> None:
    a = TraceRequest("a", 0.0, num_prompt_tokens=10, num_output_tokens=2)
    b = TraceRequest("b", 0.001, num_prompt_tokens=10, num_output_tokens=1)
    rec_a, rec_b = _worker().run([a, b])
    # step 1 [0, 2 ms): a's prefill; step 2 from 2 ms: a's decode + b's prefill = 1 + 0.5 + 1 = 2.5 ms
    assert rec_a.token_times == pytest.approx([0.002, 0.0045])
    assert rec_b.first_scheduled_s == pytest.approx(0.002) and rec_b.queueing_s == pytest.approx(0.001)
    assert rec_b.ttft_s == pytest.approx(0.0035)


def test_a_cold_adapter_waits_for_its_copy_while_a_base_request_runs_meanwhile() -> None:
    adapter = AdapterSpec("a", rank=8, num_bytes=MB)
    cold = TraceRequest("cold", 0.0, num_prompt_tokens=10, num_output_tokens=1, adapter_id="a")
    base = TraceRequest("base", 0.1, num_prompt_tokens=10, num_output_tokens=1)
    worker = _worker([adapter])
    rec_cold, rec_base = worker.run([cold, base])
    assert rec_base.token_times == pytest.approx([0.102])  # runs at its arrival, during the copy
    assert rec_cold.ttft_s == pytest.approx(0.502)  # the 0.5 s copy, then a 2 ms prefill
    executor_stats = worker.core.stats().executor
    assert isinstance(executor_stats, SimulatedExecutorStats)
    assert worker.executor.num_copies == 1 and executor_stats.num_adapter_copies == 1
    again = worker.run([TraceRequest("warm", 1.0, 10, 1, adapter_id="a")])[0]
    assert again.ttft_s == pytest.approx(0.002)  # still on the device: no copy


def test_preparing_a_cold_adapters_host_copy_runs_beside_the_running_decodes() -> None:
    """As in the native engine, the host copy (read, validate, pack) is made off the step loop before the copy
    starts: 1 MB at 0.01 GB/s = 0.1 s during which the other requests keep stepping."""
    adapter = AdapterSpec("a", rank=8, num_bytes=MB)
    base = TraceRequest("base", 0.0, num_prompt_tokens=10, num_output_tokens=3)
    cold = TraceRequest("cold", 0.001, num_prompt_tokens=10, num_output_tokens=1, adapter_id="a")
    worker = _worker([adapter], prepare_gbps=0.01)
    rec_base, rec_cold = worker.run([base, cold])
    # base: prefill [0, 2 ms), then decodes of 1.5 ms, undisturbed; a's load is planned at 2 ms: its host
    # copy is ready at 102 ms, the copy (0.5 s) lands at 602 ms, then cold prefills (2 ms)
    assert rec_base.token_times == pytest.approx([0.002, 0.0035, 0.005])
    assert rec_cold.token_times == pytest.approx([0.604])
    stats = worker.core.stats()
    assert stats.num_adapter_preparations == 1 and stats.adapter_prepare_seconds_total == pytest.approx(0.1)
    assert stats.num_prepare_waits == 1 and worker.executor.busy_seconds == pytest.approx(0.005 + 0.002)


@pytest.mark.parametrize("max_num_steps", [1, 8])
def test_steps_beside_a_preparation_cost_the_profiles_factor_until_it_ends(max_num_steps: int) -> None:
    """A CPU engine's preparer shares the step's cores (`copy.prepare_step_factor`, here 2): base's decodes cost
    2 x 1.5 ms while the host copy is made (2 - 102 ms), the one that straddles its end pays 2x for its first
    1 ms (0.5 ms of work) and 1x for the remaining 1 ms, and the steps after cost their price; one step at a
    time or in multi-step windows alike."""
    adapter = AdapterSpec("a", rank=8, num_bytes=MB)
    base = TraceRequest("base", 0.0, num_prompt_tokens=10, num_output_tokens=40)
    cold = TraceRequest("cold", 0.001, num_prompt_tokens=10, num_output_tokens=1, adapter_id="a")
    worker = _worker([adapter], prepare_gbps=0.01, prepare_step_factor=2.0, num_scheduler_steps=max_num_steps)
    rec_base, rec_cold = worker.run([base, cold])
    beside = [0.002 + 0.003 * k for k in range(34)]  # the prefill, then 33 decodes of 3 ms up to 101 ms
    after = [0.103 + 0.0015 * k for k in range(6)]
    assert rec_base.token_times[:40] == pytest.approx(beside + after)
    assert rec_cold.token_times == pytest.approx([0.604])  # the preparer's own time is the profile's


def _load_all(executor: SimulatedExecutor) -> tuple[dict[str, float], dict[str, float]]:
    """Idle until every started load landed -> when each host copy was ready and each copy landed."""
    prepared: dict[str, float] = {}
    landed: dict[str, float] = {}
    while executor.has_copies_in_flight():
        executor.wait_for_copy(10.0)
        prepared |= {r.adapter_id: executor.clock() for r in executor.take_prepared_copies()}
        landed |= {r.adapter_id: executor.clock() for r in executor.take_finished_copies()}
    return prepared, landed


@pytest.mark.parametrize(("host_cache_bytes", "num_prepares"), [(4 * MB, 1), (0, 2)])
def test_the_host_tier_spares_a_second_copy_its_preparation(host_cache_bytes: int, num_prepares: int) -> None:
    worker = _worker(
        [AdapterSpec("a", rank=8, num_bytes=MB)], prepare_gbps=0.01, host_adapter_cache_bytes=host_cache_bytes
    )
    executor = worker.executor
    for _ in range(2):
        executor.start_adapter_copy("a", None, [])
        _load_all(executor)
    assert executor.host_tier.num_misses == num_prepares
    assert worker.clock() == pytest.approx(0.1 * num_prepares + 2 * 0.5)


def test_preparations_overlap_the_copies_and_a_host_tier_hit_takes_the_link_first() -> None:
    adapters = [AdapterSpec(name, rank=8, num_bytes=MB) for name in ("a", "b", "hit")]
    executor = _worker(adapters, prepare_gbps=0.01, host_adapter_cache_bytes=4 * MB).executor
    executor.host_tier.add("hit", MB)
    for name in ("a", "b", "hit"):
        executor.start_adapter_copy(name, None, [])
    prepared, landed = _load_all(executor)
    # one preparer (0.1 s each), one link (0.5 s each), in the order the host copies are ready: "hit" at
    # once (0 - 0.5 s), then "a" (ready at 0.1 s: 0.5 - 1.0 s), then "b" (ready at 0.2 s: 1.0 - 1.5 s)
    assert prepared == pytest.approx({"hit": 0.0, "a": 0.1, "b": 0.2})
    assert landed == pytest.approx({"hit": 0.5, "a": 1.0, "b": 1.5})


def test_the_batch_limit_makes_a_request_wait_its_turn_in_the_policys_order() -> None:
    trace = [TraceRequest(f"r{i}", 0.0, num_prompt_tokens=10, num_output_tokens=2) for i in range(3)]
    records = _worker(max_num_seqs=2).run(trace)
    # steps: r0+r1 prefill (1 + 2 ms) = 3 ms; decode both 1 + 1 = 2 ms (both finish at 5 ms); r2 from 5 ms
    assert [r.finish_s for r in records[:2]] == pytest.approx([0.005, 0.005])
    assert records[2].first_scheduled_s == pytest.approx(0.005)
    assert records[2].token_times == pytest.approx([0.007, 0.0085])


def test_the_twin_runs_the_engines_own_core() -> None:
    from gpu_workers.engine import llm_engine

    assert llm_engine.EngineCore is EngineCore  # the engine imports the very class the twin runs
    assert type(_worker().core) is EngineCore


def test_synthesized_prompts_are_distinct_runs_of_ids_per_request() -> None:
    # the twin's made-up prompt ids (prefix-cache keys): request n's are 1000 + 7919 n + i, i < prompt length
    worker = _worker()
    for index, length in enumerate([5, 3]):
        worker.submit(TraceRequest(f"r{index}", 0.0, num_prompt_tokens=length, num_output_tokens=1))
    prompts = {s.request_id: s.token_ids for s in worker.core.scheduler.waiting.values()}
    assert prompts == {"r0": [1000, 1001, 1002, 1003, 1004], "r1": [8919, 8920, 8921]}
    assert all(type(t) is int for ids in prompts.values() for t in ids)


def test_an_unregistered_adapter_is_refused() -> None:
    with pytest.raises(ValueError, match="unregistered adapter 'x'"):
        _worker().run([TraceRequest("r", 0.0, 4, 1, adapter_id="x")])


def test_a_cpu_assisted_prefill_switches_to_the_device_copy_when_it_lands() -> None:
    # 10 tokens x rank 8: 80 ms on the host copy; the copy of 40 kB takes 20 ms
    cost_model = round_cost_model(host_prefill_per_token_rank_us=1000.0)
    settings = EngineSettings(cpu_prefill_workers=1, enable_prefix_caching=False)
    geometry = MemoryGeometry.plan(
        SHAPE, element_size=2, block_size=16, memory_mode="unified", kv_cache_bytes=0, num_kv_blocks=256,
        adapter_cache_bytes=4 * MB, max_lora_rank=64,
    )  # fmt: skip
    worker = SimulatedWorker(settings, geometry, cost_model, [AdapterSpec("a", 8, 40_000)], max_lora_rank=64)
    [record] = worker.run([TraceRequest("r", 0.0, num_prompt_tokens=10, num_output_tokens=1, adapter_id="a")])
    # the prefill starts at once on the host copy; its host part ends when the copy lands at 20 ms, the
    # device part (2 ms) is shorter: the step ends at 20 ms, not at 80 ms
    assert record.ttft_s == pytest.approx(0.020)
    assert worker.core.scheduler.copy_gate.num_cpu_assisted_prefills == 1
