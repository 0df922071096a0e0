"""The engine carries out the core's adapter plans: host-only adapters load before a request's first step,
idle adapters are evicted through the plan, and adapter pages come from the one page pool (the only limit
on how many adapters are on the device: there is no count cap)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from gpu_workers.engine import LLMEngine
from gpu_workers.errors import AdapterCapacityError, AdapterLoadError
from gpu_workers.host_cache import WEIGHTS_NAME
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
    engine.add_request("cold", prompt_ids[0], GREEDY, "fresh", adapter_path=adapter_dirs[name])
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
    evictions = engine.stats()["num_adapter_evictions"]
    got = engine.generate(prompts, GREEDY, adapter_ids=names)
    want = fp32_engine.generate(prompts, GREEDY, adapter_ids=names)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert engine.stats()["num_adapter_evictions"] - evictions >= 2


def test_adapter_pages_come_from_the_pool_and_kv_capacity_is_unchanged(make_engine: Any) -> None:
    engine = make_engine()
    residency, pool = engine.residency, engine.pool
    pages = sum(len(residency.get(a).page_ids) for a in residency.device_adapters())
    assert pages > 0 and pool.num_adapter_pages == pages
    assert pool.num_blocks == 256 and pool.num_free_blocks == 256  # KV capacity as configured
    assert pool.num_pages > pool.num_blocks  # plus room for the adapters


def test_default_adapter_room_holds_64_adapters_of_max_rank(fp32_engine: LLMEngine) -> None:
    runner = fp32_engine.runner
    max_rank = fp32_engine.config.max_lora_rank
    page_bytes = runner.kv_bytes_per_block()
    per_adapter = num_pages_for_adapter(max_rank, max_rank * runner.adapter_row_bytes(), page_bytes)
    assert fp32_engine.config.adapter_cache_bytes is None
    assert runner.num_adapter_pages() == 64 * per_adapter
    assert not hasattr(fp32_engine.config, "max_loaded_adapters")


def test_explicit_load_when_every_device_adapter_is_in_use_is_refused_before_building(
    make_engine: Any, fp32_engine: LLMEngine, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = one_big_adapter_engine(make_engine, fp32_engine)
    busy, other = BIG[1], BIG[0]
    assert busy in engine.device_adapters()
    engine.add_request("holds", prompt_ids[0], GREEDY, busy)
    engine.step()  # running: its adapter cannot be evicted
    builds: list[str] = []
    build = engine.runner.load_adapter
    monkeypatch.setattr(engine.runner, "load_adapter", lambda *a: builds.append(a[0]) or build(*a))
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

    monkeypatch.setattr(engine.runner, "load_adapter", fail)
    with pytest.raises(AdapterLoadError, match="out of memory"):
        engine.load_adapter("adapter-01", adapter_dirs["adapter-01"])
    assert engine.pool.num_free_pages == free_pages and engine.device_adapters() == device
    assert engine.adapter_residency("adapter-01") == "host" and "adapter-01" not in engine.loaded_adapters()


def test_planned_load_failure_ends_its_requests_with_adapter_unavailable(
    make_engine: Any, fp32_engine: LLMEngine, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]],
    tmp_path: Path,
) -> None:
    engine = make_engine()
    copy = tmp_path / "vanishing"
    shutil.copytree(adapter_dirs["adapter-04"], copy)
    engine.add_request("doomed", prompt_ids[0], GREEDY, "vanishing", adapter_path=copy)
    engine.add_request("neighbour", prompt_ids[1], GREEDY, "adapter-00")
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
    assert engine.stats()["num_adapter_load_failures"] == 1
    assert engine.device_adapters() == [other]


@pytest.mark.parametrize("policy", ["lru", "chameleon", "fastlibra"])
def test_a_queued_requests_adapter_is_prefetched_under_every_policy_and_tokens_do_not_change(
    policy: str, make_engine: Any, fp32_engine: LLMEngine, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    num_pages = max(_pages(fp32_engine, name) for name in BIG)
    page_bytes = fp32_engine.runner.kv_bytes_per_block()
    engine = make_engine(  # room for one of the two big adapters, as in one_big_adapter_engine
        num_kv_blocks=NUM_KV_BLOCKS, adapter_cache_bytes=num_pages * page_bytes, max_num_seqs=1,
        adapter_eviction_policy=policy,
    )
    cold, idle = "adapter-02", "adapter-03"
    assert engine.adapter_residency(idle) == "device" and engine.adapter_residency(cold) == "host"
    engine.add_request("warm", prompt_ids[0], GREEDY, "adapter-00")
    engine.add_request("cold", prompt_ids[1], GREEDY, cold)
    engine.step()  # "warm" runs; "cold" waits and its adapter is prefetched (evicting the idle big one)
    assert engine.adapter_residency(cold) == "device" and engine.adapter_residency(idle) == "host"
    tokens: dict[str, list[int]] = {"warm": [], "cold": []}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    [want] = fp32_engine.generate([prompt_ids[1]], GREEDY, adapter_ids=[cold])
    assert tokens["cold"] == want.token_ids
    stats = engine.stats()
    assert stats["adapter_eviction_policy"] == policy
    assert (stats["num_adapter_hits"], stats["num_adapter_misses"], stats["num_adapter_prefetches"]) == (2, 0, 1)
    assert stats["num_timed_adapter_loads"] == stats["num_adapter_loads"] > 0 and stats["adapter_load_seconds_total"] > 0
    assert stats["num_device_adapters"] + stats["num_host_adapters"] == len(adapter_dirs)
    assert stats["num_kv_pages_used"] == 0
    assert stats["num_adapter_pages"] + stats["num_free_pool_pages"] == stats["num_pool_pages"]
