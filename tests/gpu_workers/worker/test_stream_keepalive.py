"""A generate stream's keepalive (gpu_workers/worker/stream_keepalive.py): events pass through in order, blank
lines fill the wait for the first event (and only that), closing the stream closes its source; and the API's
reader skips the blank lines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from api.worker_ndjson import HttpEventSource
from gpu_workers.worker.stream_keepalive import KEEPALIVE_LINE, with_keepalive


def test_events_pass_through_in_order_with_no_keepalive_when_they_keep_coming() -> None:
    async def source() -> AsyncIterator[bytes]:
        for i in range(50):
            yield f"{i}\n".encode()

    async def run() -> list[bytes]:
        return [line async for line in with_keepalive(source(), interval_s=60.0)]

    assert asyncio.run(run()) == [f"{i}\n".encode() for i in range(50)]


def test_a_silence_is_filled_with_blank_lines_that_the_reader_skips() -> None:
    async def run() -> tuple[int, list[str]]:
        release = asyncio.Event()

        async def source() -> AsyncIterator[bytes]:
            await release.wait()  # the request waits (its turn, its adapter): nothing to send
            yield b'{"type": "delta", "text": "a"}\n'
            yield b'{"type": "final", "finish_reason": "length"}\n'

        received: list[bytes] = []
        async for line in with_keepalive(source(), interval_s=0.01):
            received.append(line)
            if received.count(KEEPALIVE_LINE) == 3:
                release.set()
        num_keepalives = received.count(KEEPALIVE_LINE)

        chunks = iter(received)

        async def read_chunk() -> bytes | None:
            return next(chunks, None)

        events = []
        source = HttpEventSource(httpx.Response(200), read_chunk)
        while (event := await source.next_event()) is not None:
            events.append(event.type)
        return num_keepalives, events

    num_keepalives, events = asyncio.run(run())
    assert num_keepalives >= 3
    assert events == ["delta", "final"]


def test_after_the_first_event_a_silence_gets_no_keepalive() -> None:
    async def source() -> AsyncIterator[bytes]:
        yield b"first\n"
        await asyncio.sleep(0.1)  # ten intervals
        yield b"second\n"

    async def run() -> list[bytes]:
        return [line async for line in with_keepalive(source(), interval_s=0.01)]

    assert asyncio.run(run()) == [b"first\n", b"second\n"]


def test_closing_the_stream_cancels_the_pending_read_and_closes_the_source() -> None:
    async def run() -> list[str]:
        log: list[str] = []

        async def source() -> AsyncIterator[bytes]:
            try:
                await asyncio.Event().wait()  # never set: the client leaves while this waits
                yield b"never\n"
            except asyncio.CancelledError:
                log.append("cancelled")
                raise
            finally:
                log.append("closed")

        stream = with_keepalive(source(), interval_s=0.01)
        assert await anext(stream) == KEEPALIVE_LINE
        await stream.aclose()
        return log

    assert asyncio.run(run()) == ["cancelled", "closed"]


def test_closing_after_the_first_event_closes_the_source() -> None:
    async def run() -> list[str]:
        log: list[str] = []

        async def source() -> AsyncIterator[bytes]:
            try:
                yield b"first\n"
                await asyncio.Event().wait()
                yield b"never\n"
            finally:
                log.append("closed")

        stream = with_keepalive(source(), interval_s=0.01)
        assert await anext(stream) == b"first\n"
        await stream.aclose()
        return log

    assert asyncio.run(run()) == ["closed"]


def test_no_interval_adds_nothing() -> None:
    async def source() -> AsyncIterator[bytes]:
        yield b"a\n"
        await asyncio.sleep(0.05)
        yield b"b\n"

    async def run() -> list[bytes]:
        return [line async for line in with_keepalive(source(), interval_s=0)]

    assert asyncio.run(run()) == [b"a\n", b"b\n"]
