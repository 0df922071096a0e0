"""An API replica holds as many concurrent streams to its workers as LORAHOST_MAX_WORKER_CONNECTIONS allows (each
stream holds one HTTP/1.1 connection): before this limit was a setting, httpx's default pool of 100 connections
made the 101st concurrent stream wait for a free one and fail after the pool timeout (10 s), a refusal by no
stated limit."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from api.worker_client import WorkerClient, WorkerStream
from cluster.membership import WorkerRecord
from cluster.protocol import GenerateRequest
from scheduler.routing.router import RouteRequest
from tests.worker_harness import serving

NUM_STREAMS = 130  # more than httpx's default pool (100)


class Barrier:
    """Holds every stream after its first delta until NUM_STREAMS are open at once (then all finish)."""

    def __init__(self) -> None:
        self.num_open = 0
        self.lock = threading.Lock()
        self.all_open = threading.Event()

    def arrive(self) -> None:
        with self.lock:
            self.num_open += 1
            if self.num_open >= NUM_STREAMS:
                self.all_open.set()


@pytest.fixture
def held_worker() -> Iterator[tuple[str, Barrier]]:
    barrier = Barrier()

    async def generate(request: Request) -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            yield (json.dumps({"type": "delta", "text": "a", "token_ids": [5]}) + "\n").encode()
            barrier.arrive()
            while not barrier.all_open.is_set():
                await asyncio.sleep(0.01)
            yield (
                json.dumps({"type": "final", "finish_reason": "length", "num_output_tokens": 1}) + "\n"
            ).encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    app = Starlette(routes=[Route("/internal/v1/generate", generate, methods=["POST"])])
    with serving(app, backlog=1024) as url:
        yield url, barrier


def test_more_streams_than_the_old_pool_are_open_at_once(held_worker: tuple[str, Barrier]) -> None:
    url, barrier = held_worker
    record = WorkerRecord("w1", url, "base", max_num_seqs=NUM_STREAMS)

    async def one(client: WorkerClient, i: int) -> list[str]:
        stream: WorkerStream = await client.start(
            RouteRequest("base", None, 3, 2), [record], GenerateRequest(request_id=f"r{i}", prompt="x")
        )
        try:
            return [event.type async for event in stream.events()]
        finally:
            await stream.aclose()

    async def run() -> list[list[str]]:
        client = WorkerClient.create("token", max_connections=NUM_STREAMS)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(NUM_STREAMS)))
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [["delta", "final"]] * NUM_STREAMS
    assert barrier.num_open == NUM_STREAMS


def test_the_limit_is_a_setting_with_a_default_far_above_the_old_pool() -> None:
    from settings import Settings

    assert Settings().api.max_worker_connections >= 4096
    assert Settings(max_worker_connections=7).api.max_worker_connections == 7
