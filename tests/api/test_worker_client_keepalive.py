"""WorkerClient reuses its keep-alive connection to a worker once a stream has ended (no connect per request); a
stream silent for longer than its read timeout is kept alive by the worker's blank keepalive lines, and ends with
an error without them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from api.worker_client import WorkerClient, WorkerUnavailableError
from cluster.membership import WorkerRecord
from cluster.protocol import GenerateEvent, GenerateRequest
from gpu_workers.worker.stream_keepalive import with_keepalive
from scheduler.routing.router import RouteRequest
from tests.worker_harness import serving


@pytest.fixture
def ndjson_worker() -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """A real HTTP server speaking the generate protocol; records each request's client address."""
    clients: list[tuple[str, int]] = []

    async def generate(request: Request) -> StreamingResponse:
        clients.append(tuple(request.scope["client"]))  # type: ignore[arg-type]

        async def lines() -> AsyncIterator[bytes]:
            yield (json.dumps({"type": "delta", "text": "a", "token_ids": [5]}) + "\n").encode()
            yield (json.dumps({"type": "final", "finish_reason": "length"}) + "\n").encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    app = Starlette(routes=[Route("/internal/v1/generate", generate, methods=["POST"])])
    with serving(app) as url:
        yield url, clients


def test_connection_is_reused_after_a_stream_that_ended_with_its_final_event(
    ndjson_worker: tuple[str, list[tuple[str, int]]],
) -> None:
    url, clients = ndjson_worker
    record = WorkerRecord("w1", url, "base", max_num_seqs=8)

    async def run() -> list[str]:
        client = WorkerClient.create("token")
        types = []
        try:
            for i in range(3):
                stream = await client.start(
                    RouteRequest("base", None, 3, 2),
                    [record],
                    GenerateRequest(request_id=f"r{i}", prompt="x"),
                )
                types += [event.type async for event in stream.events()]
                await stream.aclose()
        finally:
            await client.aclose()
        return types

    assert asyncio.run(run()) == ["delta", "final"] * 3
    assert len(clients) == 3 and len(set(clients)) == 1, clients


READ_TIMEOUT_S = 0.3
SILENCE_S = 5 * READ_TIMEOUT_S  # the request waits (its turn, its adapter) this long for its first event


@pytest.fixture(params=[READ_TIMEOUT_S / 6, 0.0], ids=["keepalive", "none"])
def silent_worker(request: pytest.FixtureRequest) -> Iterator[tuple[str, float]]:
    """A worker whose stream is silent for SILENCE_S before its first delta, with keepalive lines every
    `request.param` seconds meanwhile (0: none), as gpu_workers/worker/http_app.py sends them."""
    interval_s = float(request.param)

    async def generate(_: Request) -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            await asyncio.sleep(SILENCE_S)
            yield (json.dumps({"type": "delta", "text": "a", "token_ids": [5]}) + "\n").encode()
            yield (json.dumps({"type": "final", "finish_reason": "length"}) + "\n").encode()

        return StreamingResponse(with_keepalive(lines(), interval_s), media_type="application/x-ndjson")

    app = Starlette(routes=[Route("/internal/v1/generate", generate, methods=["POST"])])
    with serving(app) as url:
        yield url, interval_s


def test_keepalive_lines_hold_a_silent_stream_past_the_read_timeout(silent_worker: tuple[str, float]) -> None:
    url, interval_s = silent_worker
    record = WorkerRecord("w1", url, "base", max_num_seqs=8)

    async def run() -> list[GenerateEvent]:
        client = WorkerClient.create("token", read_timeout_s=READ_TIMEOUT_S)
        try:
            stream = await client.start(
                RouteRequest("base", None, 3, 2), [record], GenerateRequest(request_id="r", prompt="x")
            )
            events = [event async for event in stream.events()]
            await stream.aclose()
            return events
        finally:
            await client.aclose()

    if interval_s > 0:
        assert [e.type for e in asyncio.run(run())] == ["delta", "final"]
    else:  # nothing for longer than the read timeout before the first event: the worker is taken for gone
        with pytest.raises(WorkerUnavailableError, match="ReadTimeout"):
            asyncio.run(run())
