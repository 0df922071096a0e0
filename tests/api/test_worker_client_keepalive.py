"""WorkerClient reuses its keep-alive connection to a worker once a stream has ended (no connect per request)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from api.worker_client import WorkerClient
from cluster.membership import WorkerRecord
from cluster.protocol import GenerateRequest
from scheduler.routing.router import RouteRequest
from tests.worker_harness import free_port


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

    port = free_port()
    app = Starlette(routes=[Route("/internal/v1/generate", generate, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", clients
    server.should_exit = True
    thread.join(timeout=10)


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
