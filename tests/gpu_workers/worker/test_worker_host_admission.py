"""A worker admits a request while its adapter is only on the host: the engine core plans the device copy.

No count cap and no `overloaded` refusal: a worker whose page pool fits only 2 adapters serves concurrent
requests for 6 adapters, each with the tokens of a solo run. A planned copy that fails (the host files
vanished or became invalid after registration) ends only the requests of that adapter, with
`adapter_unavailable`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import shutil
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.protocol import AdapterRef, GenerateEvent, GenerateRequest
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.worker.adapter_manager import adapter_files
from gpu_workers.worker.host_cache import CONFIG_NAME, WEIGHTS_NAME
from scheduler.core.page_pool import num_pages_for_adapter
from scheduler.core.sampling import SamplingParams
from tests.worker_harness import RunningWorker, put_adapter, worker_in_thread

PROMPT = "hello world the river"
BIG_ADAPTERS = ("adapter-02", "adapter-03")  # the two largest demo adapters (same page count)
NUM_KV_BLOCKS = 24
MAX_TOKENS = 6


def _pages(engine: LLMEngine, name: str) -> int:
    """The adapter's pages in a static split (cut by rank rows; the unified layout counts differently)."""
    state = engine.residency.get(name)
    assert state is not None
    return num_pages_for_adapter(state.rank, state.num_bytes, engine.runner.kv_bytes_per_block())


@pytest.fixture(scope="module")
def two_slot_worker(
    base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, fp32_engine: LLMEngine
) -> Iterator[RunningWorker]:
    """A worker whose static adapter share holds exactly 2 of the big adapters (the KV pages never take one)."""
    num_pages = max(_pages(fp32_engine, name) for name in BIG_ADAPTERS)
    page_bytes = fp32_engine.runner.kv_bytes_per_block()
    blobs = tmp_path_factory.mktemp("two-slot-blobs")
    with worker_in_thread(
        base_model_dir,
        blobs,
        engine_num_kv_blocks=NUM_KV_BLOCKS,
        engine_adapter_cache_bytes=2 * num_pages * page_bytes,
        engine_memory_mode="static",
    ) as running:
        running.extra["blobs"] = blobs
        yield running


def _service(worker: RunningWorker) -> Any:
    return worker.extra["embedded"].runtime.service


def _on_worker_loop(worker: RunningWorker, coro: Coroutine[Any, Any, Any]) -> Any:
    loop = worker.extra["embedded"].runtime._loop
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=120)


def _request(request_id: str, ref: AdapterRef | None) -> GenerateRequest:
    sampling = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    return GenerateRequest(request_id=request_id, prompt=PROMPT, adapter=ref, sampling=sampling)


def _solo_tokens(fp32_engine: LLMEngine, adapter: str) -> list[int]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    return fp32_engine.generate([PROMPT], params, adapter_ids=[adapter])[0].token_ids


def _unique_copy(adapter_dir: Path, tmp_path: Path, tag: str) -> Path:
    """The adapter with its own config digest (so its host-cache entry is its own to damage)."""
    copy = tmp_path / f"adapter-{tag}"
    shutil.copytree(adapter_dir, copy)
    config = json.loads((copy / CONFIG_NAME).read_text())
    (copy / CONFIG_NAME).write_text(json.dumps({**config, "revision": tag}))
    return copy


async def _collect(service: Any, prepared: Any) -> list[GenerateEvent]:
    return [event async for event in service.stream(prepared)]


def _tokens(events: list[GenerateEvent]) -> list[int]:
    return [t for e in events if e.type == "delta" for t in e.token_ids]


def test_concurrent_requests_for_more_adapters_than_fit_all_finish_with_solo_tokens(
    two_slot_worker: RunningWorker, adapter_dirs: dict[str, Path], fp32_engine: LLMEngine
) -> None:
    blobs = two_slot_worker.extra["blobs"]
    files = {f"six-{i}": BIG_ADAPTERS[i % 2] for i in range(6)}  # 6 adapter versions, 2 weight files
    refs = {key: put_adapter(blobs, key, adapter_dirs[name]) for key, name in files.items()}
    service = _service(two_slot_worker)
    evictions_before = service.engine.engine_stats().num_adapter_evictions

    def run(key: str) -> tuple[int, Any]:
        body = _request(f"req-{key}", refs[key]).model_dump(mode="json")
        with two_slot_worker.client(timeout=120) as c, c.stream("POST", "/generate", json=body) as response:
            if response.status_code != 200:
                return response.status_code, response.read()
            return 200, [GenerateEvent.model_validate_json(line) for line in response.iter_lines() if line]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = dict(zip(refs, pool.map(run, refs)))

    solo = {name: _solo_tokens(fp32_engine, name) for name in BIG_ADAPTERS}
    for key, (status, events) in results.items():
        assert status == 200, (key, events)  # none refused
        assert events[-1].type == "final" and events[-1].num_output_tokens == MAX_TOKENS, (key, events[-1])
        assert _tokens(events) == solo[files[key]]
    stats = service.engine.engine_stats()
    assert len(stats.device_adapters) <= 2
    assert stats.num_adapter_evictions - evictions_before >= 4  # 6 adapters went through 2 places


def test_prepare_returns_with_the_adapter_on_the_host_and_the_stream_loads_it(
    two_slot_worker: RunningWorker, adapter_dirs: dict[str, Path], fp32_engine: LLMEngine
) -> None:
    ref = put_adapter(two_slot_worker.extra["blobs"], "host-first", adapter_dirs["adapter-01"])
    service = _service(two_slot_worker)
    loads_before = service.stats(service.engine.engine_stats()).scheduler.num_adapter_loads
    prepared = _on_worker_loop(two_slot_worker, service.prepare(_request("host-first-1", ref)))
    assert service.adapters.residency("host-first") == "host"  # registered, nothing on the device yet
    assert "host-first" not in service.engine.device_adapters()
    assert service.adapters.counters.num_cache_misses >= 1
    events = _on_worker_loop(two_slot_worker, _collect(service, prepared))
    assert events[-1].type == "final" and _tokens(events) == _solo_tokens(fp32_engine, "adapter-01")
    assert service.adapters.residency("host-first") == "device"
    assert (
        service.stats(service.engine.engine_stats()).scheduler.num_adapter_loads == loads_before + 1
    )  # the engine's copy

    hits_before = service.adapters.counters.num_cache_hits
    again = _on_worker_loop(two_slot_worker, service.prepare(_request("host-first-2", ref)))
    assert service.adapters.counters.num_cache_hits == hits_before + 1  # on the device at acquire
    _on_worker_loop(two_slot_worker, _collect(service, again))


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_a_failed_planned_load_ends_only_its_requests_with_adapter_unavailable(
    two_slot_worker: RunningWorker,
    adapter_dirs: dict[str, Path],
    fp32_engine: LLMEngine,
    damage: str,
    tmp_path: Path,
) -> None:
    blobs = two_slot_worker.extra["blobs"]
    broken = put_adapter(
        blobs, f"vanishes-{damage}", _unique_copy(adapter_dirs["adapter-04"], tmp_path, damage)
    )
    good = put_adapter(blobs, f"neighbour-{damage}", adapter_dirs["adapter-00"])
    service = _service(two_slot_worker)
    prepared_broken = _on_worker_loop(two_slot_worker, service.prepare(_request(f"b-{damage}", broken)))
    prepared_good = _on_worker_loop(two_slot_worker, service.prepare(_request(f"g-{damage}", good)))
    assert service.adapters.residency(broken.adapter_key) == "host"
    weights = service.host_cache.path_for(adapter_files(broken).cache_key) / WEIGHTS_NAME
    if damage == "delete":
        weights.unlink()
    else:
        weights.write_bytes(b"not a safetensors file")

    async def both() -> list[list[GenerateEvent]]:
        return list(
            await asyncio.gather(_collect(service, prepared_broken), _collect(service, prepared_good))
        )

    broken_events, good_events = _on_worker_loop(two_slot_worker, both())
    [error] = broken_events
    assert error.type == "error" and error.code == "adapter_unavailable", error
    assert broken.adapter_key in (error.message or "")
    assert good_events[-1].type == "final" and _tokens(good_events) == _solo_tokens(fp32_engine, "adapter-00")
    assert service.num_active == 0
