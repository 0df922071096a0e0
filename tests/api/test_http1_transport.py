"""The API's HTTP/1.1 transport to workers (api/http1_transport.py), against a raw asyncio server in the same
event loop: what each side sends and when is controlled with events, never with sleeps."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from api.http1_transport import Http1Transport
from api.worker_client import WorkerClient


@pytest.fixture(params=[("asyncio", {}), ("asyncio", {"use_uvloop": True})], ids=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """Both event loops the API runs on (uvicorn takes uvloop where it is installed)."""
    return request.param  # type: ignore[no-any-return]


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


@dataclass
class Server:
    """A raw HTTP server: each connection runs `handler`; counts connections and keeps the requests' heads."""

    handler: Handler
    num_connections: int = 0
    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    url: str = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        self.writers.append(writer)
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bool:
        """Read one request (head and Content-Length body); False at the end of the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        self.heads.append(head)
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        self.bodies.append(await reader.readexactly(length))
        return True


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    server = Server(handler)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        listener.close()
        for writer in server.writers:
            writer.close()


async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
    """Keep-alive: answer every request with its own body, Content-Length framed."""
    while await server.read_request(reader):
        body = server.bodies[-1] or b"empty"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.anyio
async def test_a_request_goes_out_in_one_write_and_connections_are_reused() -> None:
    async with serving(answer_each) as server, httpx.AsyncClient(transport=Http1Transport()) as client:
        for i in range(3):
            response = await client.post(f"{server.url}/internal/v1/generate?x=1", content=b"body-%d" % i)
            assert response.status_code == 200 and response.content == b"body-%d" % i
        response = await client.get(f"{server.url}/ready")
        assert response.content == b"empty"
    assert server.num_connections == 1  # kept alive and reused
    first = server.heads[0]
    assert first.startswith(b"POST /internal/v1/generate?x=1 HTTP/1.1\r\n")
    assert b"content-length: 6\r\n" in first.lower() and b"host: 127.0.0.1:" in first.lower()
    assert b"content-length" not in server.heads[3].lower()  # a GET without a body


@pytest.mark.anyio
async def test_a_chunked_stream_arrives_as_it_is_sent() -> None:
    go_on = asyncio.Event()

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b'{"a": 1}\n'))
        await go_on.wait()
        writer.write(chunk(b'{"b": 2}\n') + b"0\r\n\r\n")
        await server.read_request(reader)  # the connection is reused for the next request
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")

    async with serving(stream) as server, httpx.AsyncClient(transport=Http1Transport()) as client:
        async with client.stream("POST", f"{server.url}/g", content=b"{}") as response:
            parts = response.aiter_bytes()
            assert await parts.__anext__() == b'{"a": 1}\n'  # before the rest is sent
            go_on.set()
            assert [p async for p in parts] == [b'{"b": 2}\n']
        assert (await client.post(f"{server.url}/g", content=b"{}")).status_code == 204
    assert server.num_connections == 1


@pytest.mark.anyio
async def test_at_most_max_connections_open_and_the_next_request_waits_its_turn() -> None:
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await server.read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"first"))
            await release.wait()
            writer.write(chunk(b"last") + b"0\r\n\r\n")

    transport = Http1Transport(httpx.Limits(max_connections=2, max_keepalive_connections=2))
    async with serving(slow) as server, httpx.AsyncClient(transport=transport) as client:
        async with AsyncExitStack() as streams:
            responses = [
                await streams.enter_async_context(client.stream("POST", f"{server.url}/g", content=b"{}"))
                for _ in range(2)
            ]
            assert transport.num_in_use == 2
            with pytest.raises(httpx.PoolTimeout):  # the stated limit: a third waits, up to its pool timeout
                await client.post(f"{server.url}/g", content=b"{}", timeout=httpx.Timeout(5.0, pool=0.05))
            waiting = asyncio.create_task(client.post(f"{server.url}/g", content=b"{}"))
            await asyncio.sleep(0)
            assert not waiting.done() and server.num_connections == 2
            release.set()  # the streams end: the waiting request gets a connection, reused
            for response in responses:
                assert await response.aread() == b"firstlast"
        response = await waiting
        assert response.content == b"firstlast"
    assert server.num_connections == 2 and transport.num_in_use == 0


@pytest.mark.anyio
async def test_an_idle_connection_the_peer_closes_leaves_the_pool_and_its_socket_is_closed() -> None:
    async with serving(answer_each) as server, httpx.AsyncClient(transport=Http1Transport()) as client:
        transport = client._transport
        assert isinstance(transport, Http1Transport)
        await client.post(server.url, content=b"one")
        assert transport.num_idle == 1
        (connection,) = transport._idle[next(iter(transport._idle))]
        lost = asyncio.get_running_loop().create_future()
        connection.on_lost, pool_on_lost = (
            (lambda c: (pool_on_lost(c), lost.set_result(None))),
            connection.on_lost,
        )
        server.writers[0].close()  # the worker's keep-alive timeout
        await asyncio.wait_for(lost, 10)
        assert (
            transport.num_idle == 0 and connection.transport is not None and connection.transport.is_closing()
        )
        assert (await client.post(server.url, content=b"two")).content == b"two"
    assert server.num_connections == 2


@pytest.mark.anyio
async def test_a_slow_reader_stops_the_socket_being_read_instead_of_buffering() -> None:
    sent = asyncio.Event()
    total = 4 * 1024 * 1024

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        writer.write(b"x" * total)
        try:
            await asyncio.wait_for(writer.drain(), 0.5)
        except TimeoutError:  # the client stopped reading: the bytes wait in the server's buffer
            pass
        sent.set()
        await writer.drain()

    transport = Http1Transport(max_buffered_bytes=64 * 1024)
    async with (
        serving(flood) as server,
        httpx.AsyncClient(transport=transport) as client,
        client.stream("POST", server.url, content=b"{}") as response,
    ):
        parts = response.aiter_raw()
        await parts.__anext__()
        await sent.wait()
        connection = response.stream._stream._connection  # type: ignore[attr-defined]
        assert connection._num_buffered <= 64 * 1024 + 256 * 1024  # its limit, plus one socket read
        assert server.writers[0].transport.get_write_buffer_size() > 0  # held back at the worker
        assert sum([len(p) async for p in parts]) > 0
    assert transport.num_in_use == 0


async def reset_midway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
    await server.read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"part"))
    await writer.drain()
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    writer.transport.abort()


@pytest.mark.anyio
async def test_errors_are_httpx_errors() -> None:
    async with serving(reset_midway) as server, httpx.AsyncClient(transport=Http1Transport()) as client:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            async with client.stream("POST", server.url, content=b"{}") as response:
                async for _ in response.aiter_bytes():
                    pass

    silent_forever = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.read_request(reader)
        await silent_forever.wait()

    async with serving(silent) as server, httpx.AsyncClient(transport=Http1Transport()) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(server.url, content=b"{}", timeout=httpx.Timeout(5.0, read=0.05))

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")

    async with serving(garbage) as server, httpx.AsyncClient(transport=Http1Transport()) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(server.url, content=b"{}")

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    async with httpx.AsyncClient(transport=Http1Transport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(f"http://127.0.0.1:{port}/", content=b"{}")


@pytest.mark.anyio
async def test_the_read_timeout_counts_from_each_wait_s_own_start() -> None:
    # one timer per connection: armed by the wait for the headers, it fires while the second chunk's wait (begun
    # later) is still within its own timeout, and must re-arm for that wait instead of failing it
    read_timeout_s = 2.0
    late = asyncio.Event()

    async def paced(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.read_request(reader)
        loop = asyncio.get_running_loop()
        started = loop.time()
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"first"))
        await asyncio.sleep(
            max(0.0, started + 1.25 * read_timeout_s - loop.time())
        )  # past the first deadline
        writer.write(chunk(b"second") + b"0\r\n\r\n")
        late.set()

    timeout = httpx.Timeout(30.0, read=read_timeout_s)
    async with (
        serving(paced) as server,
        httpx.AsyncClient(transport=Http1Transport()) as client,
        client.stream("POST", server.url, content=b"{}", timeout=timeout) as response,
    ):
        parts = response.aiter_bytes()
        assert await parts.__anext__() == b"first"
        await asyncio.sleep(0.5 * read_timeout_s)  # the next wait starts this much after the first
        assert [p async for p in parts] == [b"second"]
    assert late.is_set()


@pytest.mark.anyio
async def test_a_stream_closed_early_or_told_to_close_is_not_reused() -> None:
    async def answer_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server
    ) -> None:
        while await server.read_request(reader):
            if server.bodies[-1] == b"close":
                writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
            elif server.bodies[-1] == b"early":  # half the body, then nothing until the client leaves
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
            await writer.drain()

    transport = Http1Transport()
    async with serving(answer_then_close) as server, httpx.AsyncClient(transport=transport) as client:
        async with client.stream("POST", server.url, content=b"early") as response:
            await response.aiter_raw().__anext__()  # left before the end
        assert transport.num_idle == 0
        assert (await client.post(server.url, content=b"close")).content == b"ok"
        assert transport.num_idle == 0
        assert (await client.post(server.url, content=b"whole")).content == b"0123456789"
        assert transport.num_idle == 1
    assert server.num_connections == 3


def test_the_worker_client_uses_it_by_default() -> None:
    client = WorkerClient.create("token")
    assert isinstance(client.transport, Http1Transport)
    assert client.transport.max_connections == 8192
