"""The engine carries out the core's adapter plans: host-only adapters load before a request's first step,
idle adapters are evicted through the plan, and adapter pages come from the one page pool (the only limit
on how many adapters are on the device: there is no count cap)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.errors import AdapterCapacityError, AdapterLoadError
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.worker.host_cache import WEIGHTS_NAME
from scheduler.core.engine_request import EngineRequest
from scheduler.core.page_pool import num_pages_for_adapter
from scheduler.core.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
BIG = ("adapter-02", "adapter-03")  # the two largest demo adapters (same page count)
NUM_KV_BLOCKS = 16


def _pages(engine: LLMEngine, name: str) -> int:
    return engine.residency.num_pages_for(engine.residency.get(name))  # type: ignore[arg-type]


def one_big_adapter_engine(make_engine: Any, fp32_engine: LLMEngine) -> LLMEngine:
    """An engine whose pool holds one big adapter (plus small ones), never both big ones at once."""
    num_pages = max(_pages(fp32_engine, name) for name in BIG)
    assert num_pages > NUM_KV_BLOCKS  # spilling into free KV pages cannot fit the second one either
    page_bytes = fp32_engine.runner.kv_bytes_per_block()
    return make_engine(num_kv_blocks=NUM_KV_BLOCKS, adapter_cache_bytes=num_pages * page_bytes)


def test_request_with_host_only_adapter_runs_after_the_planned_load(
    make_engine: Any, fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    engine = one_big_adapter_engine(make_engine, fp32_engine)  # loading adapter-03 evicted adapter-02
    assert "adapter-03" in engine.device_adapters() and engine.adapter_residency("adapter-02") == "host"
    [cold] = engine.generate([prompt_ids[1]], GREEDY, adapter_ids=["adapter-02"])
    [warm] = fp32_engine.generate([prompt_ids[1]], GREEDY, adapter_ids=["adapter-02"])
    assert cold.token_ids == warm.token_ids
    assert "adapter-02" in engine.device_adapters() and engine.adapter_residency("adapter-03") == "host"


def test_add_request_takes_the_adapter_host_path(
    make_engine: Any, fp32_engine: LLMEngine, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = make_engine()
    name = sorted(adapter_dirs)[1]
    engine.add_request(EngineRequest("cold", prompt_ids[0], GREEDY, "fresh", adapter_path=adapter_dirs[name]))
    assert engine.adapter_residency("fresh") == "host"
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.new_token_ids
    assert engine.adapter_residency("fresh") == "device"
    [warm] = fp32_engine.generate([prompt_ids[0]], GREEDY, adapter_ids=[name])
    assert tokens == warm.token_ids


def test_requests_of_more_adapters_than_fit_all_finish_with_the_same_tokens(
    make_engine: Any, fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    engine = one_big_adapter_engine(make_engine, fp32_engine)
    names = [BIG[0], BIG[1], BIG[0]]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(3)]
    evictions = engine.engine_stats().num_adapter_evictions
    got = engine.generate(prompts, GREEDY, adapter_ids=names)
    want = fp32_engine.generate(prompts, GREEDY, adapter_ids=names)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert engine.engine_stats().num_adapter_evictions - evictions >= 2


def test_static_split_adapter_pages_come_from_their_own_share(make_engine: Any) -> None:
    engine = make_engine(memory_mode="static")
    residency, pool, runner = engine.residency, engine.pool, engine.runner
    pages = sum(len(residency.get(a).page_ids) for a in residency.device_adapters())
    assert pages > 0 and pool.num_adapter_pages == pages
    assert pool.num_blocks == 256 and pool.num_free_blocks == 256  # KV capacity as configured
    assert pool.num_pages > pool.num_blocks  # plus the fixed adapter share
    adapter_bytes = sum(_tensor_bytes(a) for a in runner.adapters.values())
    assert adapter_bytes <= pages * runner.kv_bytes_per_block()  # never more than the pages it was given


def test_unified_pool_stores_adapters_inside_the_kv_pages(make_engine: Any) -> None:
    engine = make_engine(memory_mode="unified")
    residency, pool = engine.residency, engine.pool
    pages = sum(len(residency.get(a).page_ids) for a in residency.device_adapters())
    assert pages > 0 and pool.num_adapter_pages == pages
    assert pool.num_pages == pool.num_blocks == 256 and pool.num_free_blocks == 256 - pages  # one budget
    _assert_exact_device_memory(engine)


def _tensor_bytes(adapter: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _adapter_tensors(adapter))


def _adapter_tensors(adapter: Any) -> list[Any]:
    return [t for layer in adapter.layers for p in layer.values() for t in (p.a_t, *(b for *_, b in p.parts))]


def _assert_exact_device_memory(engine: LLMEngine) -> None:
    """Unified pool: the KV tensors are the whole budget and every resident adapter tensor is a view of its
    own pages there, which no sequence's block table holds."""
    runner, pool, residency = engine.runner, engine.pool, engine.residency
    kv = [t for pair in runner.kv_caches for t in pair]
    assert sum(t.numel() * t.element_size() for t in kv) == pool.num_pages * runner.kv_bytes_per_block()
    kv_ptrs = {t.untyped_storage().data_ptr() for t in kv}
    block_pages = {
        p for seq in [*engine.scheduler.waiting.values(), *engine.scheduler.running] for p in seq.block_table
    }
    for adapter_id, adapter in runner.adapters.items():
        page_ids = residency.get(adapter_id).page_ids
        assert not block_pages & set(page_ids)
        lo, hi = page_ids[0] * runner.page_numel, (page_ids[-1] + 1) * runner.page_numel
        for tensor in _adapter_tensors(adapter):
            assert tensor.untyped_storage().data_ptr() in kv_ptrs
            offset = tensor.storage_offset()
            assert lo <= offset and offset + tensor.numel() <= hi


def test_unified_pool_under_load_with_more_adapters_than_fit_keeps_tokens_and_the_budget(
    make_engine: Any, fp32_engine: LLMEngine, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    probe = make_engine(memory_mode="unified")
    largest = max(len(probe.residency.get(a).page_ids) for a in probe.device_adapters())
    # room for the largest adapter plus the requests' KV, not for every adapter at once
    engine = make_engine(memory_mode="unified", num_kv_blocks=largest + 24)
    names = sorted(adapter_dirs)
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(8)]
    adapters = [names[i % len(names)] for i in range(8)]
    for i, (prompt, adapter) in enumerate(zip(prompts, adapters)):
        engine.add_request(EngineRequest(f"r{i}", prompt, GREEDY, adapter))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(8)}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        _assert_exact_device_memory(engine)
    want = fp32_engine.generate(prompts, GREEDY, adapter_ids=adapters)
    assert [tokens[f"r{i}"] for i in range(8)] == [o.token_ids for o in want]
    assert engine.engine_stats().num_adapter_evictions > 0


def test_default_static_adapter_share_holds_64_adapters_of_max_rank(
    make_engine: Any, fp32_engine: LLMEngine
) -> None:
    engine = make_engine(memory_mode="static")
    runner = engine.runner
    max_rank = engine.config.max_lora_rank
    page_bytes = runner.kv_bytes_per_block()
    per_adapter = num_pages_for_adapter(max_rank, max_rank * runner.adapter_row_bytes(), page_bytes)
    assert engine.config.adapter_cache_bytes is None
    assert runner.num_adapter_pages() == 64 * per_adapter
    assert fp32_engine.runner.num_adapter_pages() == 0  # unified (default): no share, adapters take KV pages
    assert not hasattr(engine.config, "max_loaded_adapters")


def test_explicit_load_when_every_device_adapter_is_in_use_is_refused_before_building(
    make_engine: Any,
    fp32_engine: LLMEngine,
    adapter_dirs: dict[str, Path],
    prompt_ids: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = one_big_adapter_engine(make_engine, fp32_engine)
    busy, other = BIG[1], BIG[0]
    assert busy in engine.device_adapters()
    engine.add_request(EngineRequest("holds", prompt_ids[0], GREEDY, busy))
    engine.step()  # running: its adapter cannot be evicted
    builds: list[str] = []
    build = engine.runner.transfers.load_adapter
    monkeypatch.setattr(engine.runner.transfers, "load_adapter", lambda *a: builds.append(a[0]) or build(*a))
    with pytest.raises(AdapterCapacityError, match="in use"):
        engine.load_adapter(other, adapter_dirs[other])
    assert builds == []  # the pool said no before any device tensor was built
    assert engine.adapter_residency(other) == "host"
    engine.abort("holds")
    engine.load_adapter(other, adapter_dirs[other])
    assert builds == [other] and other in engine.device_adapters() and busy not in engine.device_adapters()


def test_explicit_load_whose_build_fails_leaves_nothing_half_done(
    make_engine: Any, adapter_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine()
    engine.unload_adapter("adapter-01")
    free_pages, device = engine.pool.num_free_pages, engine.device_adapters()

    def fail(*_: Any) -> Any:
        raise RuntimeError("device out of memory")

    monkeypatch.setattr(engine.runner.transfers, "load_adapter", fail)
    with pytest.raises(AdapterLoadError, match="out of memory"):
        engine.load_adapter("adapter-01", adapter_dirs["adapter-01"])
    assert engine.pool.num_free_pages == free_pages and engine.device_adapters() == device
    assert engine.adapter_residency("adapter-01") == "host" and "adapter-01" not in engine.loaded_adapters()


def test_planned_load_failure_ends_its_requests_with_adapter_unavailable(
    make_engine: Any,
    fp32_engine: LLMEngine,
    adapter_dirs: dict[str, Path],
    prompt_ids: list[list[int]],
    tmp_path: Path,
) -> None:
    engine = make_engine()
    copy = tmp_path / "vanishing"
    shutil.copytree(adapter_dirs["adapter-04"], copy)
    engine.add_request(EngineRequest("doomed", prompt_ids[0], GREEDY, "vanishing", adapter_path=copy))
    engine.add_request(EngineRequest("neighbour", prompt_ids[1], GREEDY, "adapter-00"))
    (copy / WEIGHTS_NAME).unlink()  # the host copy vanished after registration
    outputs: dict[str, list[Any]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    [doomed] = outputs["doomed"]
    assert doomed.finish_reason == "error" and doomed.error_code == "adapter_unavailable"
    assert "vanishing" in (doomed.error or "")
    assert engine.adapter_residency("vanishing") == "host" and engine.pool.num_kv_pages == 0
    neighbour = outputs["neighbour"]
    assert neighbour[-1].finish_reason == "length" and neighbour[-1].error_code is None
    [want] = fp32_engine.generate([prompt_ids[1]], GREEDY, adapter_ids=["adapter-00"])
    assert [t for o in neighbour for t in o.new_token_ids] == want.token_ids
    assert engine.engine_stats().num_adapter_load_failures == 1


@pytest.mark.parametrize("policy", ["lru", "chameleon", "fastlibra"])
def test_a_queued_requests_adapter_is_prefetched_under_every_policy_and_tokens_do_not_change(
    policy: str,
    make_engine: Any,
    fp32_engine: LLMEngine,
    adapter_dirs: dict[str, Path],
    prompt_ids: list[list[int]],
) -> None:
    num_pages = max(_pages(fp32_engine, name) for name in BIG)
    page_bytes = fp32_engine.runner.kv_bytes_per_block()
    engine = make_engine(  # room for one of the two big adapters, as in one_big_adapter_engine
        num_kv_blocks=NUM_KV_BLOCKS,
        adapter_cache_bytes=num_pages * page_bytes,
        max_num_seqs=1,
        adapter_eviction_policy=policy,
    )
    cold, idle = "adapter-02", "adapter-03"
    assert engine.adapter_residency(idle) == "device" and engine.adapter_residency(cold) == "host"
    warm = next(a for a in engine.device_adapters() if a != idle)  # a small adapter that stayed resident
    engine.add_request(EngineRequest("warm", prompt_ids[0], GREEDY, warm))
    engine.add_request(EngineRequest("cold", prompt_ids[1], GREEDY, cold))
    engine.step()  # "warm" runs; "cold" waits and its adapter is prefetched (evicting the idle big one)
    # the load runs beside the step: landed, or still preparing or copying on a loaded machine (never waited
    # for here)
    assert engine.adapter_residency(cold) in ("preparing", "copying", "device")
    assert engine.adapter_residency(idle) == "host"
    tokens: dict[str, list[int]] = {"warm": [], "cold": []}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    [want] = fp32_engine.generate([prompt_ids[1]], GREEDY, adapter_ids=[cold])
    assert tokens["cold"] == want.token_ids
    stats = engine.engine_stats()
    assert stats.adapter_eviction_policy == policy
    assert (stats.num_adapter_hits, stats.num_adapter_misses, stats.num_adapter_prefetches) == (
        2,
        0,
        1,
    )
    assert (
        stats.num_timed_adapter_loads == stats.num_adapter_loads > 0 and stats.adapter_load_seconds_total > 0
    )
    assert stats.num_device_adapters + stats.num_host_adapters == len(adapter_dirs)
    assert stats.num_kv_pages_used == 0
    assert stats.num_adapter_pages + stats.num_free_pool_pages == stats.num_pool_pages


@pytest.mark.parametrize("host_bytes", [2 << 30, 0])
def test_an_adapter_copied_back_to_the_device_comes_from_the_host_tier(
    host_bytes: int, make_engine: Any, fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    num_pages = max(_pages(fp32_engine, name) for name in BIG)
    page_bytes = fp32_engine.runner.kv_bytes_per_block()
    engine = make_engine(  # one big adapter at a time: each request evicts the other one
        num_kv_blocks=NUM_KV_BLOCKS,
        adapter_cache_bytes=num_pages * page_bytes,
        host_adapter_cache_bytes=host_bytes,
    )
    order = ["adapter-02", "adapter-03", "adapter-02", "adapter-03"]
    got = [engine.generate([prompt_ids[0]], GREEDY, adapter_ids=[name])[0].token_ids for name in order]
    want = {n: fp32_engine.generate([prompt_ids[0]], GREEDY, adapter_ids=[n])[0].token_ids for n in BIG}
    assert got == [want[n] for n in order]
    stats = engine.runner_stats()
    assert stats.num_adapter_copies == 4  # every request copied its adapter back
    if host_bytes:  # the first copy of each read the files; the second came from host memory
        assert (stats.num_host_tier_hits, stats.num_host_tier_misses) == (2, 2)
        assert stats.num_host_tier_adapters == 2 and stats.host_tier_bytes > 0
    else:
        assert (stats.num_host_tier_hits, stats.num_host_tier_misses) == (0, 4)
        assert stats.num_host_tier_adapters == 0


def test_an_adapter_that_would_leave_no_kv_page_in_a_unified_pool_is_refused_not_queued_forever(
    base_model_dir: Path, fp32_engine: LLMEngine, adapter_dirs: dict[str, Path]
) -> None:
    name = max(BIG, key=lambda n: _pages(fp32_engine, n))
    num_pages = _pages(fp32_engine, name)
    exact = LLMEngine(EngineConfig(model_path=base_model_dir, dtype="float32", num_kv_blocks=num_pages))
    with pytest.raises(AdapterLoadError, match="leaves room for"):
        exact.register_adapter(name, adapter_dirs[name])
    assert exact.adapter_residency(name) == "none"
    roomy = LLMEngine(EngineConfig(model_path=base_model_dir, dtype="float32", num_kv_blocks=num_pages + 1))
    roomy.register_adapter(name, adapter_dirs[name])
    assert roomy.adapter_residency(name) == "host"


def test_without_the_adapter_cache_an_adapter_leaves_the_device_once_its_requests_finish(
    make_engine: Any, fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    engine = make_engine(is_caching_idle_adapters=False)
    engine.step()  # nothing runs: the explicitly loaded, idle demo adapters leave the device
    assert engine.loaded_adapters() == [] and engine.device_adapters() == []
    got = engine.generate(prompt_ids[:2], GREEDY, adapter_ids=["adapter-01", "adapter-01"])
    want = fp32_engine.generate(prompt_ids[:2], GREEDY, adapter_ids=["adapter-01", "adapter-01"])
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    engine.step()
    assert engine.adapter_residency("adapter-01") == "host" and engine.loaded_adapters() == []
    assert fp32_engine.adapter_residency("adapter-01") == "device"  # the adapter cache keeps it


def test_runner_geometry_is_the_torch_free_geometry_of_its_config(fp32_engine: LLMEngine) -> None:
    from scheduler.core.memory_geometry import MemoryGeometry, ModelShape

    config = fp32_engine.config
    expected = MemoryGeometry.plan(
        ModelShape.from_model_dir(config.model_path),
        element_size=4,
        block_size=config.block_size,
        memory_mode=config.memory_mode,
        kv_cache_bytes=config.kv_cache_bytes,
        num_kv_blocks=config.num_kv_blocks,
        adapter_cache_bytes=config.adapter_cache_bytes,
        max_lora_rank=config.max_lora_rank,
        max_model_len=config.max_model_len,
    )
    assert fp32_engine.runner.geometry == expected
    assert fp32_engine.pool.num_pages == expected.num_pool_pages
    assert sum(k.numel() * k.element_size() * 2 for k, _ in fp32_engine.runner.kv_caches) == (
        expected.num_kv_blocks * expected.kv_bytes_per_block
    )
