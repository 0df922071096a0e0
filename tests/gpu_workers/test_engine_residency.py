"""The engine carries out the core's adapter plans: host-only adapters load before a request's first step,
idle adapters are evicted through the plan, and adapter pages come from the one page pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_workers.engine import LLMEngine
from gpu_workers.errors import AdapterCapacityError
from scheduler.core.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def test_request_with_host_only_adapter_runs_after_the_planned_load(
    make_engine: Any, fp32_engine: LLMEngine, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = make_engine(max_loaded_adapters=1)  # loading every adapter evicted all but the last
    first, last = min(adapter_dirs), max(adapter_dirs)
    assert engine.device_adapters() == [last] and engine.adapter_residency(first) == "host"
    [cold] = engine.generate([prompt_ids[1]], GREEDY, adapter_ids=[first])
    [warm] = fp32_engine.generate([prompt_ids[1]], GREEDY, adapter_ids=[first])
    assert cold.token_ids == warm.token_ids
    assert engine.device_adapters() == [first] and engine.adapter_residency(last) == "host"


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


def test_requests_of_more_adapters_than_slots_all_finish_with_the_same_tokens(
    make_engine: Any, fp32_engine: LLMEngine, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = make_engine(max_loaded_adapters=1)
    names = sorted(adapter_dirs)[:3]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(3)]
    got = engine.generate(prompts, GREEDY, adapter_ids=list(names))
    want = fp32_engine.generate(prompts, GREEDY, adapter_ids=list(names))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert engine.stats()["num_adapter_evictions"] >= 2


def test_adapter_pages_come_from_the_pool_and_kv_capacity_is_unchanged(make_engine: Any) -> None:
    engine = make_engine()
    residency, pool = engine.residency, engine.pool
    pages = sum(len(residency.get(a).page_ids) for a in residency.device_adapters())
    assert pages > 0 and pool.num_adapter_pages == pages
    assert pool.num_blocks == 256 and pool.num_free_blocks == 256  # KV capacity as configured
    assert pool.num_pages > pool.num_blocks  # plus room for the adapters


def test_loading_when_every_device_adapter_is_in_use_is_refused(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = make_engine(max_loaded_adapters=1)
    [busy] = engine.device_adapters()
    engine.add_request("holds", prompt_ids[0], GREEDY, busy)
    other = next(n for n in sorted(adapter_dirs) if n != busy)
    with pytest.raises(AdapterCapacityError, match="in use"):
        engine.load_adapter(other, adapter_dirs[other])
    engine.abort("holds")
    engine.load_adapter(other, adapter_dirs[other])
    assert engine.device_adapters() == [other]


@pytest.mark.parametrize("policy", ["lru", "chameleon", "fastlibra"])
def test_a_queued_requests_adapter_is_prefetched_under_every_policy_and_tokens_do_not_change(
    policy: str, make_engine: Any, fp32_engine: LLMEngine, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = make_engine(max_loaded_adapters=2, max_num_seqs=1, adapter_eviction_policy=policy)
    resident = engine.device_adapters()
    cold = next(n for n in sorted(adapter_dirs) if n not in resident)
    engine.add_request("warm", prompt_ids[0], GREEDY, resident[-1])
    engine.add_request("cold", prompt_ids[1], GREEDY, cold)
    engine.step()  # "warm" runs; "cold" waits and its adapter is prefetched (evicting the idle adapter)
    assert engine.adapter_residency(cold) == "device" and engine.adapter_residency(resident[0]) == "host"
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
    assert stats["num_device_adapters"] == 2 and stats["num_host_adapters"] == len(adapter_dirs) - 2
    assert stats["num_kv_pages_used"] == 0
    assert stats["num_adapter_pages"] + stats["num_free_pool_pages"] == stats["num_pool_pages"]
