"""The in-process worker transport (embedded mode) against the HTTP one, over one real in-thread worker.

The API's WorkerClient reaches the embedded worker either over HTTP or through InProcessWorkerTransport;
both must give the same events, the same refusal mapping, and a close before the end must abort.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from api.worker_client import WorkerClient, WorkerStream, WorkerUnavailableError
from cluster.membership import WorkerRecord
from cluster.protocol import AdapterRef, GenerateEvent, GenerateRequest
from gpu_workers.worker.embedded import EmbeddedWorker
from gpu_workers.worker.inproc_transport import InProcessWorkerTransport
from gpu_workers.worker.worker_service import WorkerService
from scheduler.core.engine_stats import EngineStats
from tests.worker_harness import RunningWorker, put_adapter

PROMPT = "hello world the river"


def _embedded(worker: RunningWorker) -> EmbeddedWorker:
    return worker.extra["embedded"]


def _record(worker: RunningWorker) -> WorkerRecord:
    (record,) = worker.directory.list_live()
    return record


def _request(request_id: str, adapter: AdapterRef | None = None, **sampling: Any) -> GenerateRequest:
    sampling = {"max_tokens": 8, "temperature": 0, "ignore_eos": True, **sampling}
    return GenerateRequest(request_id=request_id, prompt=PROMPT, adapter=adapter, sampling=sampling)


def _with_client(worker: RunningWorker, local: bool, fn: Callable[[WorkerClient], Awaitable[Any]]) -> Any:
    """Run fn(client) on a fresh event loop in this thread (the worker's loop is another thread's)."""

    async def main() -> Any:
        transport = _embedded(worker).transport if local else None
        client = WorkerClient.create(worker.internal_token, local=transport)
        try:
            return await fn(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def _generate(worker: RunningWorker, request: GenerateRequest, *, local: bool) -> list[GenerateEvent]:
    async def run(client: WorkerClient) -> list[GenerateEvent]:
        stream = await client.open(_record(worker), request)
        try:
            return [event async for event in stream.events()]
        finally:
            await stream.aclose()

    return _with_client(worker, local, run)


def _open_outcome(worker: RunningWorker, request: GenerateRequest, *, local: bool) -> GenerateEvent | str:
    """The first event of a stream, or "unavailable" when the client raised WorkerUnavailableError."""

    async def run(client: WorkerClient) -> GenerateEvent | str:
        try:
            stream = await client.open(_record(worker), request)
        except WorkerUnavailableError:
            return "unavailable"
        await stream.aclose()
        return stream.first

    return _with_client(worker, local, run)


def _wait_idle(worker: RunningWorker) -> EngineStats:
    engine_stats = _embedded(worker).runtime.service.engine.engine_stats  # type: ignore[union-attr]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats: EngineStats = engine_stats()
        if not stats.num_running and not stats.num_waiting:
            return stats
        time.sleep(0.02)
    last: EngineStats = engine_stats()
    return last


def test_serves_only_its_own_worker(worker: RunningWorker) -> None:
    transport = _embedded(worker).transport
    assert isinstance(transport, InProcessWorkerTransport)
    record = _record(worker)
    assert transport.serves(record)
    assert not transport.serves(WorkerRecord("other", "http://127.0.0.1:1", record.base_model))


@pytest.mark.parametrize("with_adapter", [False, True])
def test_in_process_streams_the_same_events_as_http(
    worker: RunningWorker, blob_dir: Path, adapter_dirs: dict[str, Path], with_adapter: bool
) -> None:
    ref = put_adapter(blob_dir, "v-same", adapter_dirs["adapter-01"]) if with_adapter else None
    over_http = _generate(worker, _request(f"http-{with_adapter}", ref, max_tokens=12), local=False)
    in_process = _generate(worker, _request(f"local-{with_adapter}", ref, max_tokens=12), local=True)

    for events in (over_http, in_process):
        *deltas, final = events
        assert deltas and all(e.type == "delta" for e in deltas) and final.type == "final"
        assert final.num_output_tokens == 12 and final.finish_reason == "length"
        assert 0 <= final.queue_ms <= final.ttft_ms <= final.e2e_ms
    assert [t for e in in_process for t in e.token_ids] == [t for e in over_http for t in e.token_ids]
    assert "".join(e.text for e in in_process) == "".join(e.text for e in over_http)
    assert in_process[-1].num_prompt_tokens == over_http[-1].num_prompt_tokens
    service = _embedded(worker).runtime.service
    assert service is not None
    _wait_no_active(service)
    assert service.num_active == 0


def test_close_mid_stream_aborts_the_engine_request_and_frees_everything(
    worker: RunningWorker, blob_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    service = _embedded(worker).runtime.service
    assert service is not None
    ref = put_adapter(blob_dir, "v-abort", adapter_dirs["adapter-02"])
    num_aborted = service.engine.engine_stats().num_aborted

    async def run(client: WorkerClient) -> WorkerStream:
        stream = await client.open(_record(worker), _request("abort-1", ref, max_tokens=900))
        events = stream.events()
        assert (await anext(events)).type == "delta"
        assert (await anext(events)).type == "delta"
        await events.aclose()
        await stream.aclose()  # the client disconnected
        return stream

    stream = _with_client(worker, True, run)
    assert stream.is_closed and not stream.has_ended
    stats = _wait_idle(worker)
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_kv_pages_used == 0  # no KV page held (idle adapters may stay cached)
    assert stats.num_aborted == num_aborted + 1
    _wait_no_active(service)
    assert service.num_active == 0
    assert not service.adapters._leases.get("v-abort")  # the lease was released


def test_cancelling_the_caller_aborts_too(worker: RunningWorker) -> None:
    service = _embedded(worker).runtime.service
    assert service is not None
    num_aborted = service.engine.engine_stats().num_aborted

    async def run(client: WorkerClient) -> None:
        stream = await client.open(_record(worker), _request("cancel-1", max_tokens=900))

        is_streaming = asyncio.Event()

        async def consume() -> None:
            try:
                async for _ in stream.events():
                    is_streaming.set()
            finally:
                await stream.aclose()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(is_streaming.wait(), timeout=60)  # cancelled mid-stream, not before it began
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _with_client(worker, True, run)
    stats = _wait_idle(worker)
    assert stats.num_aborted == num_aborted + 1
    assert stats.num_kv_pages_used == 0  # no KV page held (idle adapters may stay cached)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"sampling": {"temperature": -1}}, "temperature"),
        ({"prompt": "word " * 2000}, "max_model_len"),
        ({"prompt": None}, "exactly one of prompt"),
    ],
)
def test_bad_requests_map_like_http(worker: RunningWorker, change: dict[str, Any], needle: str) -> None:
    request = GenerateRequest.model_validate({**_request("bad").model_dump(), **change})
    over_http = _open_outcome(worker, request, local=False)
    in_process = _open_outcome(worker, request, local=True)
    for event in (over_http, in_process):
        assert isinstance(event, GenerateEvent)
        assert event.type == "error" and event.code == "bad_request" and needle in (event.message or "")
    assert in_process == over_http


def test_adapter_unavailable_maps_like_http(
    worker: RunningWorker, blob_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    good = put_adapter(blob_dir, "v-corrupt", adapter_dirs["adapter-03"])
    for ref in (
        good.model_copy(update={"sha256": "0" * 64}),
        good.model_copy(update={"adapter_key": "v-missing", "weights_blob_key": "adapters/nope/w"}),
    ):
        over_http = _open_outcome(worker, _request("bad-adapter", ref), local=False)
        in_process = _open_outcome(worker, _request("bad-adapter", ref), local=True)
        for event in (over_http, in_process):
            assert isinstance(event, GenerateEvent)
            assert event.code == "adapter_unavailable" and ref.adapter_key in (event.message or "")
        assert in_process.code == over_http.code  # type: ignore[union-attr]


def test_duplicate_request_id_is_bad_request(worker: RunningWorker) -> None:
    async def run(client: WorkerClient) -> GenerateEvent:
        running = await client.open(_record(worker), _request("dup-1", max_tokens=900))
        try:
            second = await client.open(_record(worker), _request("dup-1"))
            return second.first
        finally:
            await running.aclose()

    event = _with_client(worker, True, run)
    assert (
        event.type == "error" and event.code == "bad_request" and "already running" in (event.message or "")
    )
    _wait_idle(worker)


@pytest.mark.parametrize("state", ["draining", "loading"])
def test_draining_and_not_ready_are_retryable_like_http(worker: RunningWorker, state: str) -> None:
    runtime = _embedded(worker).runtime
    service = runtime.service
    try:
        if state == "draining":
            runtime._is_draining = True
        else:
            runtime.service = None
        assert _open_outcome(worker, _request(f"refused-{state}"), local=False) == "unavailable"
        assert _open_outcome(worker, _request(f"refused-{state}"), local=True) == "unavailable"
    finally:
        runtime._is_draining = False
        runtime.service = service

    async def run(client: WorkerClient) -> str:
        try:
            await client.start(_route(worker), [_record(worker)], _request(f"refused-{state}-start"))
        except WorkerUnavailableError as exc:
            return str(exc)
        return "started"

    try:
        runtime._is_draining = state == "draining"
        runtime.service = service if state == "draining" else None
        message = _with_client(worker, True, run)
    finally:
        runtime._is_draining = False
        runtime.service = service
    assert ("draining" if state == "draining" else "overloaded") in message


def test_a_stopped_worker_loop_is_unavailable(worker: RunningWorker) -> None:
    runtime = _embedded(worker).runtime
    transport = InProcessWorkerTransport(runtime)
    loop = runtime._loop
    try:
        runtime._loop = None

        async def run(client: WorkerClient) -> str:
            client.local = transport
            try:
                await client.open(_record(worker), _request("no-loop"))
            except WorkerUnavailableError as exc:
                return str(exc)
            return "started"

        assert "not running" in _with_client(worker, True, run)
    finally:
        runtime._loop = loop


def _route(worker: RunningWorker) -> Any:
    from scheduler.routing.router import RouteRequest

    return RouteRequest(base_model=_record(worker).base_model)


def _wait_no_active(service: WorkerService, timeout_s: float = 10.0) -> None:
    """The worker leaves a request's bookkeeping on its own loop just after the final event: wait for it."""
    deadline = time.monotonic() + timeout_s
    while service.num_active and time.monotonic() < deadline:
        time.sleep(0.01)
