"""Worker internal API over a real engine, the tiny model and a real local blob store (in-thread worker)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.membership import WorkerRecord
from cluster.protocol import INTERNAL_PREFIX, AdapterRef, GenerateEvent, GenerateRequest, WorkerStats
from gpu_workers.worker.embedded import EmbeddedWorker
from scheduler.core.sampling import SamplingParams
from tests.worker_harness import RunningWorker, put_adapter, worker_in_thread

PROMPT = "hello world the river"


@pytest.fixture
def client(worker: RunningWorker) -> Iterator[httpx.Client]:
    with worker.client(timeout=60) as c:
        yield c


def _service(worker: RunningWorker) -> Any:
    embedded: EmbeddedWorker = worker.extra["embedded"]
    return embedded.runtime.service


def _on_worker_loop(worker: RunningWorker, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine on the worker's event loop (its state is owned by that loop)."""
    loop = worker.extra["embedded"].runtime._loop
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)


async def _finish(service: Any, prepared: Any) -> None:
    service.finish(prepared)


def _body(request_id: str, adapter: AdapterRef | None = None, **sampling: Any) -> dict[str, Any]:
    sampling = {"max_tokens": 8, "temperature": 0, "ignore_eos": True, **sampling}
    return GenerateRequest(
        request_id=request_id, prompt=PROMPT, adapter=adapter, sampling=sampling
    ).model_dump(mode="json")


def _generate(client: httpx.Client, body: dict[str, Any]) -> list[GenerateEvent]:
    with client.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("application/x-ndjson")
        return [GenerateEvent.model_validate_json(line) for line in response.iter_lines() if line]


def _stats(client: httpx.Client) -> WorkerStats:
    return WorkerStats.model_validate(client.get("/stats").json())


def test_generate_streams_deltas_then_one_final_equal_to_direct_greedy(
    client: httpx.Client, blob_dir: Path, adapter_dirs: dict[str, Path], fp32_engine: Any
) -> None:
    ref = put_adapter(blob_dir, "v-greedy", adapter_dirs["adapter-01"])
    events = _generate(client, _body("greedy-1", ref, max_tokens=12))
    expected = fp32_engine.generate(
        [PROMPT], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), adapter_ids=["adapter-01"]
    )[0]

    *deltas, final = events
    assert all(e.type == "delta" for e in deltas) and final.type == "final"
    assert [t for e in deltas for t in e.token_ids] == expected.token_ids
    assert "".join(e.text for e in deltas) == expected.text
    assert final.finish_reason == "length"
    assert final.num_output_tokens == 12 == len(expected.token_ids)
    assert final.num_prompt_tokens == len(expected.prompt_token_ids)
    assert 0 <= final.queue_ms <= final.ttft_ms <= final.e2e_ms
    assert final.tpot_ms is not None and final.tpot_ms >= 0


def test_prompt_token_ids_and_base_model_without_adapter(client: httpx.Client, fp32_engine: Any) -> None:
    token_ids = fp32_engine.tokenizer.encode(PROMPT)
    body = {**_body("ids-1"), "prompt": None, "prompt_token_ids": token_ids}
    events = _generate(client, body)
    expected = fp32_engine.generate(
        [token_ids], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    )[0]
    assert [t for e in events[:-1] for t in e.token_ids] == expected.token_ids
    assert events[-1].num_prompt_tokens == len(token_ids)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer"}],
)
def test_missing_or_wrong_token_is_401_on_every_route(worker: RunningWorker, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=worker.url + INTERNAL_PREFIX, headers=headers, timeout=30) as anon:
        for method, path in [
            ("POST", "/generate"),
            ("GET", "/stats"),
            ("GET", "/ready"),
            ("GET", "/health"),
            ("POST", "/adapters/prefetch"),
            ("POST", "/adapters/drop"),
        ]:
            response = anon.request(method, path, json=_body("unauth") if method == "POST" else None)
            assert response.status_code == 401, (path, response.text)
            assert response.json()["error"]["type"] == "unauthorized"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"sampling": {"temperature": -1}}, "temperature"),
        ({"sampling": {"max_tokens": 0}}, "max_tokens"),
        ({"prompt": "word " * 2000}, "max_model_len"),
        ({"prompt": None}, "exactly one of prompt"),
        ({"sampling": "nonsense"}, "invalid request body"),
    ],
)
def test_bad_requests_are_400_before_any_stream(
    client: httpx.Client, change: dict[str, Any], needle: str
) -> None:
    response = client.post("/generate", json={**_body("bad"), **change})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "bad_request" and needle in error["message"]


def test_client_disconnect_mid_stream_aborts_and_frees_blocks(
    worker: RunningWorker, client: httpx.Client
) -> None:
    engine_stats = _service(worker).engine.engine_stats
    num_aborted = engine_stats().num_aborted
    with client.stream("POST", "/generate", json=_body("disconnect-1", max_tokens=900)) as response:
        lines = response.iter_lines()
        assert json.loads(next(lines))["type"] == "delta"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and engine_stats().num_running + engine_stats().num_waiting:
        time.sleep(0.05)
    stats = engine_stats()
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_kv_pages_used == 0  # no KV page held (idle adapters may stay cached)
    assert stats.num_aborted == num_aborted + 1
    deadline = time.monotonic() + 10
    while _service(worker).num_active and time.monotonic() < deadline:  # bookkeeping after the engine's abort
        time.sleep(0.01)
    assert _service(worker).num_active == 0


def test_concurrent_first_requests_fetch_and_load_the_adapter_once(
    worker: RunningWorker, blob_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    ref = put_adapter(blob_dir, "v-concurrent", adapter_dirs["adapter-02"])
    service = _service(worker)
    fetches, loads = service.host_cache.stats().num_fetches, service.engine.engine_stats().num_adapter_loads

    def run(i: int) -> list[GenerateEvent]:
        with worker.client(timeout=60) as c:
            return _generate(c, _body(f"conc-{i}", ref, max_tokens=4))

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(run, range(6)))

    assert all(r[-1].type == "final" and r[-1].num_output_tokens == 4 for r in results)
    assert len({tuple(t for e in r for t in e.token_ids) for r in results}) == 1
    assert service.host_cache.stats().num_fetches == fetches + 1
    assert service.engine.engine_stats().num_adapter_loads == loads + 1  # one copy to the device
    assert _stats(worker.client(timeout=30)).scheduler.num_adapter_loads == loads + 1
    assert "v-concurrent" in service.adapters.device_adapters()


def test_sha_mismatch_or_missing_blob_is_adapter_unavailable(
    client: httpx.Client, blob_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    good = put_adapter(blob_dir, "v-corrupt", adapter_dirs["adapter-03"])
    for ref in (
        good.model_copy(update={"sha256": "0" * 64}),
        good.model_copy(update={"adapter_key": "v-missing", "weights_blob_key": "adapters/nope/w"}),
    ):
        response = client.post("/generate", json=_body("bad-adapter", ref))
        assert response.status_code == 424
        error = response.json()["error"]
        assert error["type"] == "adapter_unavailable" and ref.adapter_key in error["message"]
        assert ref.adapter_key not in _stats(client).scheduler.device_adapters


def test_prefetch_drop_and_residency(
    client: httpx.Client, blob_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    ref = put_adapter(blob_dir, "v-prefetch", adapter_dirs["adapter-04"])
    response = client.post("/adapters/prefetch", json=ref.model_dump())
    assert response.json() == {"adapter_key": "v-prefetch", "residency": "device"}
    loaded = _stats(client)
    assert "v-prefetch" in loaded.scheduler.device_adapters
    # the engine's adapter cache counters and page split reach /stats
    assert loaded.scheduler.num_timed_adapter_loads >= 1 and loaded.scheduler.adapter_load_seconds_total > 0
    assert loaded.scheduler.num_adapter_pages > 0 and loaded.scheduler.num_free_pool_pages > 0
    assert client.post("/adapters/drop", json={"adapter_key": "v-prefetch"}).json() == {"dropped": True}
    stats = _stats(client)
    assert "v-prefetch" not in stats.scheduler.device_adapters and "v-prefetch" in stats.host_adapters
    assert stats.scheduler.num_adapter_evictions > loaded.scheduler.num_adapter_evictions
    assert client.post("/adapters/drop", json={"adapter_key": "v-prefetch"}).json() == {"dropped": False}


def test_health_ready_stats_and_heartbeat_record(worker: RunningWorker, client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").status_code == 200
    stats = _stats(client)
    assert stats.worker_id == worker.worker_id and stats.is_ready and not stats.is_draining
    assert stats.scheduler.num_total_kv_blocks == 256
    # the kernels this machine's tuner chose for the worker's model (gpu_workers/engine/kernel_plan.py)
    kernels = {
        "linear_weights",
        "prefill_gemm",
        "decode_attention",
        "decode_lora",
        "prefill_attention",
        "decode_step",
    }
    assert set(stats.engine.kernel_choices) == kernels and stats.engine.kernel_tuner_s >= 0.0
    [record] = worker.directory.list_live()
    assert record.worker_id == worker.worker_id and record.url == worker.url and record.is_ready
    # the record is the worker's stats plus its URL, typed (one model: WorkerRecord.from_stats)
    assert set(WorkerRecord.model_fields) == set(WorkerStats.model_fields) | {"url"}
    assert record.scheduler.num_total_kv_blocks == 256 and record.max_num_seqs == stats.max_num_seqs


def test_prefetch_evicts_idle_adapters_first_and_never_refuses_for_room(
    base_model_dir: Path, tmp_path: Path, adapter_dirs: dict[str, Path], fp32_engine: Any
) -> None:
    residency = fp32_engine.residency
    largest = max(adapter_dirs, key=lambda n: residency.num_pages_for(residency.get(n)))
    num_pages = residency.num_pages_for(residency.get(largest))
    assert num_pages > 24  # the free KV pages cannot hold a third one either
    blobs = tmp_path / "blobs"
    refs = {n: put_adapter(blobs, n, adapter_dirs[largest]) for n in "abcd"}  # four keys, same page count
    with (
        worker_in_thread(
            base_model_dir,
            blobs,
            engine_num_kv_blocks=24,
            engine_adapter_cache_bytes=2 * num_pages * fp32_engine.runner.kv_bytes_per_block(),  # room for 2
        ) as w,
        w.client(timeout=60) as c,
    ):
        service = _service(w)
        request = GenerateRequest(request_id="holds-a", prompt=PROMPT, adapter=refs["a"])
        prepared = _on_worker_loop(w, service.prepare(request))  # admitted: leases "a" until finished
        assert service.adapters.residency("a") == "host"  # the engine copies it before its first step
        assert c.post("/adapters/prefetch", json=refs["a"].model_dump()).json()["residency"] == "device"
        c.post("/adapters/prefetch", json=refs["b"].model_dump())
        assert service.adapters.device_adapters() == ["a", "b"]  # "a" is least recently used, but in use

        c.post("/adapters/prefetch", json=refs["c"].model_dump())
        assert service.adapters.device_adapters() == ["a", "c"]  # "b" (idle) was evicted instead

        request_c = GenerateRequest(request_id="holds-c", prompt=PROMPT, adapter=refs["c"])
        prepared_c = _on_worker_loop(w, service.prepare(request_c))
        response = c.post("/adapters/prefetch", json=refs["d"].model_dump())
        assert response.status_code == 200 and response.json() == {"adapter_key": "d", "residency": "host"}
        assert service.adapters.device_adapters() == ["a", "c"]  # no room now: a hint, not a refusal

        for p in (prepared, prepared_c):
            _on_worker_loop(w, _finish(service, p))
        c.post("/adapters/prefetch", json=refs["d"].model_dump())
        assert service.adapters.device_adapters() == ["c", "d"]
        assert sorted(service.engine.loaded_adapters()) == ["c", "d"]
        assert _stats(c).host_adapters == ("a", "b")
