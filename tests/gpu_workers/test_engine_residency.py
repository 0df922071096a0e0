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
    residency, pool, runner = engine.residency, engine.pool, engine.runner
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
    block_pages = {p for seq in [*engine.scheduler.waiting.values(), *engine.scheduler.running] for p in seq.block_table}
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
        engine.add_request(f"r{i}", prompt, GREEDY, adapter)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(8)}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        _assert_exact_device_memory(engine)
    want = fp32_engine.generate(prompts, GREEDY, adapter_ids=adapters)
    assert [tokens[f"r{i}"] for i in range(8)] == [o.token_ids for o in want]
    assert engine.stats()["num_adapter_evictions"] > 0


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
