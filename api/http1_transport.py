"""The API's HTTP/1.1 client transport to workers: asyncio protocols and httptools' C parser behind httpx.

Why not httpx's own transport (httpcore + h11): at 2,000 streams through one API replica, profiled with py-spy,
httpcore's pool bookkeeping (`_assign_requests_to_connections` scans every connection, and for each idle one
calls `has_expired`, a `select` on its socket, on every request start and stream close) and h11's pure-Python
parsing of each chunk took over half of the replica's busy samples (benchmarks/RESULTS.md, "Chaos & scale,
sixth pass"). Here a pool is a stack of idle connections per origin and a counter: O(1) per request start and
close; each connection parses with httptools (the parser uvicorn uses), and a request goes out in one write.

Behaviour callers rely on (the same as httpx's default transport, without proxies):
- at most `limits.max_connections` open together (streaming or idle): a request beyond waits its turn, FIFO, and
  fails with httpx.PoolTimeout after the request's pool timeout; an idle connection is closed to make room;
- up to `limits.max_keepalive_connections` idle connections kept, each for `limits.keepalive_expiry` seconds;
  one the peer closes leaves the pool at once (its socket is closed then: no CLOSE_WAIT);
- backpressure: a connection stops reading from its socket while more than `max_buffered_bytes` of body are
  unread, so a slow consumer slows its worker's stream instead of growing the API's memory;
- errors are httpx's: ConnectError, ConnectTimeout, ReadTimeout, ReadError, RemoteProtocolError, PoolTimeout;
- a stream closed before its end closes its connection; one read to its end returns the connection to the pool
  unless the response said `Connection: close`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator

import httpx

from api.http1_connection import Http1Connection, Origin

DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
MAX_BUFFERED_BYTES = 64 * 1024  # unread body bytes per connection before it stops reading its socket
NEXT_CHUNK_EXTENSION = "lorahost.next_chunk"  # a response's body reader, a coroutine per chunk (_BodyStream)


class _BodyStream(httpx.AsyncByteStream):
    """A response body as it arrives; closing it returns or closes its connection, once."""

    def __init__(
        self, transport: Http1Transport, connection: Http1Connection, read_timeout: float | None
    ) -> None:
        self._transport = transport
        self._connection: Http1Connection | None = connection
        self._read_timeout = read_timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self.next_chunk()) is not None:
            yield chunk

    async def next_chunk(self) -> bytes | None:
        """The next body bytes as they arrive; None at the end of the body (also the response's
        NEXT_CHUNK_EXTENSION: api/worker_ndjson.py reads with it)."""
        connection = self._connection
        if connection is None:
            raise httpx.StreamClosed()
        while True:
            chunk = connection.take_chunk()
            if chunk is not None:
                return chunk
            if connection.is_complete:
                return None
            if connection.error is not None:
                raise connection.error
            await connection.wait(self._read_timeout, httpx.ReadTimeout)

    async def aclose(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            self._transport.release(connection)


def _request_bytes(request: httpx.Request, body: bytes) -> bytes:
    """The request line, headers and body, as sent (Content-Length set from the body)."""
    target = request.url.raw_path
    lines = [request.method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        if name.lower() not in (b"content-length", b"transfer-encoding"):
            lines += [name, b": ", value, b"\r\n"]
    if body or request.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines += [b"Content-Length: ", str(len(body)).encode("ascii"), b"\r\n"]
    lines += [b"\r\n", body]
    return b"".join(lines)


class Http1Transport(httpx.AsyncBaseTransport):
    """An httpx transport for plain HTTP/1.1 (and HTTPS) to known hosts; see the module docstring."""

    def __init__(
        self,
        limits: httpx.Limits = DEFAULT_LIMITS,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.max_connections = limits.max_connections
        self.max_idle = (
            limits.max_keepalive_connections if limits.max_keepalive_connections is not None else 0
        )
        self.keepalive_expiry = limits.keepalive_expiry
        self.max_buffered_bytes = max_buffered_bytes
        self._ssl_context = ssl_context
        self._idle: dict[Origin, list[Http1Connection]] = {}  # per origin, oldest first
        self.num_idle = 0
        self.num_in_use = 0  # connections carrying a request, or being opened for one
        self._waiters: deque[tuple[Origin, asyncio.Future[Http1Connection | None]]] = deque()
        self._is_closed = False

    @property
    def num_open(self) -> int:
        """Connections open (in use or idle)."""
        return self.num_in_use + self.num_idle

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` on an idle connection to its origin or a new one; the body streams as it arrives."""
        if self._is_closed:
            raise RuntimeError("the transport is closed")
        scheme = request.url.raw_scheme
        if scheme not in (b"http", b"https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}")
        port = request.url.port or (443 if scheme == b"https" else 80)
        origin = (scheme, request.url.raw_host, port)
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()  # requests to workers are small JSON documents
        connection = await self._acquire(origin, timeouts.get("pool"), timeouts.get("connect"))
        try:
            connection.start(_request_bytes(request, body))
            while not connection.is_headers_complete:
                if connection.error is not None:
                    raise connection.error
                await connection.wait(timeouts.get("read"), httpx.ReadTimeout)
        except BaseException:
            connection.close()
            self.release(connection)
            raise
        is_head = request.method == "HEAD"
        if is_head:  # no body follows, whatever Content-Length says: do not reuse
            connection.is_complete = True
            connection.close()
        body_stream = _BodyStream(self, connection, timeouts.get("read"))
        return httpx.Response(
            status_code=connection.status_code,
            headers=connection.headers,
            stream=body_stream,
            extensions={"http_version": b"HTTP/1.1", NEXT_CHUNK_EXTENSION: body_stream.next_chunk},
        )

    async def _acquire(
        self, origin: Origin, pool_timeout: float | None, connect_timeout: float | None
    ) -> Http1Connection:
        """A connection to `origin`, counted in use: an idle one, else a new one once there is room."""
        connection = self._take_idle(origin)
        if connection is None:
            connection = await self._wait_turn(origin, pool_timeout)
        if connection is not None:
            return connection
        try:
            return await self._connect(origin, connect_timeout)
        except BaseException:
            self.num_in_use -= 1
            self._wake_next()
            raise

    def _take_idle(self, origin: Origin) -> Http1Connection | None:
        """The newest idle connection to `origin` still usable, counted in use; expired ones are closed."""
        stack = self._idle.get(origin)
        now = asyncio.get_running_loop().time()
        while stack:
            connection = stack.pop()
            self._forget_idle(connection)
            if connection.is_reusable and now - connection.idle_since < (
                self.keepalive_expiry or float("inf")
            ):
                self.num_in_use += 1
                return connection
            connection.close()
        return None

    def _forget_idle(self, connection: Http1Connection) -> None:
        connection.on_lost = None
        self.num_idle -= 1

    async def _wait_turn(self, origin: Origin, pool_timeout: float | None) -> Http1Connection | None:
        """Room for one more connection (counted in use; None returned), or a connection to `origin` handed
        over as another request ends; requests that find neither wait, first come first served."""
        if not self._waiters and self._has_room():
            self.num_in_use += 1
            return None
        waiter: asyncio.Future[Http1Connection | None] = asyncio.get_running_loop().create_future()
        entry = (origin, waiter)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(waiter, pool_timeout)
        except TimeoutError:
            raise httpx.PoolTimeout("no connection to a worker became free in time") from None
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # given its turn, then cancelled: pass it on
                given = waiter.result()
                if given is None:
                    self.num_in_use -= 1
                    self._wake_next()
                else:
                    self.release(given)
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def _has_room(self) -> bool:
        """Whether a connection may be opened now (closing the oldest idle one if that makes room)."""
        if self.max_connections is None:
            return True
        if self.num_open >= self.max_connections:
            self._close_oldest_idle()
        return self.num_open < self.max_connections

    def _wake_next(self) -> None:
        """Serve waiting requests in order while possible: an idle connection to the origin, or room for a new
        one (counted in use for them)."""
        while self._waiters:
            origin, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            connection = self._take_idle(origin)
            if connection is None:
                if not self._has_room():
                    return
                self.num_in_use += 1
            self._waiters.popleft()
            waiter.set_result(connection)

    def _close_oldest_idle(self) -> None:
        oldest: list[Http1Connection] | None = None
        for stack in self._idle.values():
            if stack and (oldest is None or stack[0].idle_since < oldest[0].idle_since):
                oldest = stack
        if oldest is not None:
            connection = oldest.pop(0)
            self._forget_idle(connection)
            connection.close()

    async def _connect(self, origin: Origin, connect_timeout: float | None) -> Http1Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        name = host.decode("ascii")
        is_tls = scheme == b"https"
        if is_tls and self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Http1Connection(origin, self.max_buffered_bytes),
                    name,
                    port,
                    ssl=self._ssl_context if is_tls else None,
                    server_hostname=name if is_tls else None,
                ),
                connect_timeout,
            )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {name}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {name}:{port}: {exc}") from exc
        return protocol

    def release(self, connection: Http1Connection) -> None:
        """A request's connection is free again: kept idle if it can be reused and there is room, else closed."""
        self.num_in_use -= 1
        if connection.is_reusable and self.max_idle > 0 and not self._is_closed:
            if self.num_idle >= self.max_idle:
                self._close_oldest_idle()
            connection.cancel_timer()
            connection.idle_since = asyncio.get_running_loop().time()
            connection.on_lost = self._on_idle_lost
            self._idle.setdefault(connection.origin, []).append(connection)
            self.num_idle += 1
        else:
            connection.close()
        self._wake_next()

    def _on_idle_lost(self, connection: Http1Connection) -> None:
        stack = self._idle.get(connection.origin)
        if stack is not None and connection in stack:
            stack.remove(connection)
            self._forget_idle(connection)
            self._wake_next()

    async def aclose(self) -> None:
        """Close the idle connections; streams in flight close theirs when they end."""
        self._is_closed = True
        for stack in self._idle.values():
            for connection in stack:
                connection.on_lost = None
                connection.close()
        self._idle.clear()
        self.num_idle = 0
