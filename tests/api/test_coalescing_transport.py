"""WorkerClient sends each request to a worker in one write (headers + body), not one per h11 event, through
public httpx/httpcore API, and errors surface as httpx errors."""

from __future__ import annotations

import socket
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpcore
import httpx
import pytest

from api.coalescing_transport import CoalescingStream, CoalescingTransport
from api.worker_client import WorkerClient


class RecordingStream(httpcore.AsyncNetworkStream):
    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.log.append(("read", max_bytes))
        return b"reply"

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.log.append(("write", buffer))

    async def aclose(self) -> None:
        self.log.append(("close", None))

    def get_extra_info(self, info: str) -> Any:
        return f"info:{info}"


@pytest.mark.anyio
async def test_writes_are_joined_and_sent_before_the_next_read() -> None:
    inner = RecordingStream()
    stream = CoalescingStream(inner)
    await stream.write(b"POST / HTTP/1.1\r\n\r\n")
    await stream.write(b"")
    await stream.write(b"{}")
    assert inner.log == []
    assert await stream.read(10) == b"reply"
    assert inner.log == [("write", b"POST / HTTP/1.1\r\n\r\n{}"), ("read", 10)]
    await stream.read(5)  # nothing pending: no empty write
    assert inner.log[-1] == ("read", 5) and len(inner.log) == 3
    assert stream.get_extra_info("is_readable") == "info:is_readable"
    await stream.write(b"abandoned")
    await stream.aclose()
    assert inner.log[-1] == ("close", None) and ("write", b"abandoned") not in inner.log


class RecordingBackend(httpcore.AsyncNetworkBackend):
    """Records every write of every connection; reads are read from a canned HTTP response."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.writes: list[bytes] = []

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        backend = self

        class Stream(RecordingStream):
            def __init__(self) -> None:
                super().__init__()
                self.unread = backend.reply

            async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
                data, self.unread = self.unread[:max_bytes], self.unread[max_bytes:]
                return data

            async def write(self, buffer: bytes, timeout: float | None = None) -> None:
                backend.writes.append(buffer)

            def get_extra_info(self, info: str) -> Any:
                return None

        return Stream()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


@pytest.mark.anyio
async def test_a_post_goes_out_in_one_write_and_the_body_streams_back() -> None:
    reply = b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"ok": true}'
    backend = RecordingBackend(reply)
    async with httpx.AsyncClient(transport=CoalescingTransport(network_backend=backend)) as client:
        response = await client.post("http://worker:9/internal/v1/generate", content=b'{"request_id": "r"}')
    assert response.status_code == 200 and response.json() == {"ok": True}
    [request] = backend.writes
    assert request.startswith(b"POST /internal/v1/generate HTTP/1.1\r\n")
    assert b"\r\nHost: worker:9\r\n" in request and request.endswith(b'\r\n\r\n{"request_id": "r"}')


@pytest.mark.anyio
async def test_a_refused_connection_is_an_httpx_connect_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        async with httpx.AsyncClient(transport=CoalescingTransport()) as client:
            with pytest.raises(httpx.ConnectError):
                await client.post(f"http://127.0.0.1:{port}/internal/v1/generate", content=b"{}")


@pytest.mark.anyio
async def test_a_broken_response_is_an_httpx_protocol_error() -> None:
    backend = RecordingBackend(b"not http at all\r\n\r\n")
    async with httpx.AsyncClient(transport=CoalescingTransport(network_backend=backend)) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("http://worker:9/")


@pytest.mark.anyio
async def test_the_default_client_coalesces() -> None:
    client = WorkerClient.create("token")
    try:
        assert isinstance(client.http._transport, CoalescingTransport)  # type: ignore[attr-defined]
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_streams_fill_the_first_pool_with_room_up_to_the_stated_limit_and_no_further() -> None:
    reply = b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"ok": true}'
    limits = httpx.Limits(max_connections=5, max_keepalive_connections=2)
    transport = CoalescingTransport(limits, RecordingBackend(reply), max_pool_connections=2)
    timeout = httpx.Timeout(5.0, pool=0.2)
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client, AsyncExitStack() as streams:
        await streams.enter_async_context(client.stream("GET", "http://worker:9/"))
        assert transport.num_in_flight == [1, 0, 0]  # a light load stays in the first pool
        for _ in range(4):  # every one of the 5 allowed streams opens at once, in whichever pool has room
            await streams.enter_async_context(client.stream("GET", "http://worker:9/"))
        assert transport.num_in_flight == [2, 2, 1]
        with pytest.raises(httpx.PoolTimeout):  # the sixth waits for a connection: the stated limit
            await client.get("http://worker:9/")
        assert sum(transport.num_in_flight) == 5
    assert transport.num_in_flight == [0, 0, 0]


class PeerClosingBackend(RecordingBackend):
    """Connections that answer once, then are closed by the peer when `is_peer_closed` is set."""

    def __init__(self, reply: bytes) -> None:
        super().__init__(reply)
        self.is_peer_closed = False
        self.streams: list[Any] = []

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        stream = await super().connect_tcp(*args, **kwargs)
        backend = self

        class Closing(type(stream)):  # type: ignore[misc]
            is_closed = False

            def get_extra_info(self, info: str) -> Any:
                return backend.is_peer_closed if info == "is_readable" else None

            async def aclose(self) -> None:
                self.is_closed = True

        closing = Closing()
        self.streams.append(closing)
        return closing


@pytest.mark.anyio
async def test_idle_connections_the_peer_closed_are_closed_in_pools_no_request_uses() -> None:
    reply = b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"ok": true}'
    backend = PeerClosingBackend(reply)
    limits = httpx.Limits(max_connections=6, max_keepalive_connections=6)
    transport = CoalescingTransport(limits, backend, max_pool_connections=2)
    async with httpx.AsyncClient(transport=transport) as client:
        async with AsyncExitStack() as streams:  # a burst fills all three pools
            responses = [
                await streams.enter_async_context(client.stream("GET", "http://worker:9/")) for _ in range(6)
            ]
            for response in responses:
                await response.aread()
        assert transport.num_in_flight == [0, 0, 0] and len(backend.streams) == 6
        assert not any(s.is_closed for s in backend.streams)  # idle, kept for reuse
        backend.is_peer_closed = True  # the worker closes them (its keep-alive timeout): CLOSE_WAIT here
        for _ in range(4):  # a light load, in the first pool only, sweeps the others in turn
            await client.get("http://worker:9/")
        assert all(s.is_closed for s in backend.streams[:6])
