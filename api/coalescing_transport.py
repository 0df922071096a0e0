"""An httpx transport that writes each HTTP/1.1 request in one send, built on public httpx and httpcore API.

httpcore writes a request's headers, body and end separately: two or three TCP segments and as many
wake-ups of the worker's event loop per request. `CoalescingStream` holds writes until the connection's
next read (or TLS start) and sends them joined. Measured with benchmarks/worker_client_writes.py against
a uvicorn stub worker (2-core machine shared with other work, alternating rounds, 8 deltas per request):
CPU per request -6% in the client (665 vs 710 us) and -8% in the worker (300 vs 325 us), lower in 7 of 8
rounds of 1000 requests; first event p50 -4 to -9% (median over rounds, three runs; single rounds vary
more). Throughput of 16 concurrent clients was within the machine's noise.

`CoalescingTransport` is httpx's default transport without proxies: an `httpcore.AsyncConnectionPool`
(given the coalescing network backend through its `network_backend` argument) behind
`httpx.AsyncBaseTransport`, with httpx's default limits and TLS context and httpcore's errors raised as
the httpx errors of the same name (as httpx's own transport does), so callers catch `httpx.HTTPError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
# connections one httpcore pool holds: it scans all of them (and, for each idle one, all again) on every request
# start and stream close
MAX_POOL_CONNECTIONS = 128


class CoalescingStream(httpcore.AsyncNetworkStream):
    """A connection whose writes are held until the next read (or TLS start), then sent as one."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._pending: list[bytes] = []
        self._write_timeout: float | None = None

    async def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            await self._stream.write(data, timeout=self._write_timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Send what is held, then read."""
        await self._flush()
        return await self._stream.read(max_bytes, timeout=timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Hold `buffer` until the next read."""
        if buffer:
            self._pending.append(buffer)
            self._write_timeout = timeout

    async def aclose(self) -> None:
        """Close the connection; an unsent request is abandoned with it."""
        self._pending.clear()
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        """Send what is held, then upgrade; the TLS stream coalesces too."""
        await self._flush()
        return CoalescingStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        """The wrapped stream's extra info."""
        return self._stream.get_extra_info(info)


class CoalescingBackend(httpcore.AsyncNetworkBackend):
    """A network backend whose connections coalesce their writes (httpcore's default backend inside)."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._backend = backend or httpcore.AnyIOBackend()

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        """A coalescing TCP connection."""
        return CoalescingStream(await self._backend.connect_tcp(*args, **kwargs))

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        """A coalescing Unix-socket connection."""
        return CoalescingStream(await self._backend.connect_unix_socket(*args, **kwargs))

    async def sleep(self, seconds: float) -> None:
        """The wrapped backend's sleep."""
        await self._backend.sleep(seconds)


@contextmanager
def _httpx_errors() -> Iterator[None]:
    """Re-raise an httpcore error as the httpx error of the same name (httpx.TransportError if none)."""
    try:
        yield
    except (
        httpcore.TimeoutException,
        httpcore.NetworkError,
        httpcore.ProtocolError,
        httpcore.ProxyError,
        httpcore.UnsupportedProtocol,
    ) as exc:
        raise _httpx_error(exc) from exc


def _httpx_error(exc: Exception) -> httpx.TransportError:
    for cls in type(exc).__mro__:
        mapped = getattr(httpx, cls.__name__, None)
        if isinstance(mapped, type) and issubclass(mapped, httpx.TransportError):
            return mapped(str(exc))
    return httpx.TransportError(str(exc))


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream: Any, on_close: Callable[[], None]) -> None:
        self._stream = stream
        self._on_close: Callable[[], None] | None = on_close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            if self._on_close is not None:
                on_close, self._on_close = self._on_close, None
                on_close()


def shares(total: int, num_parts: int) -> list[int]:
    """`total` split into num_parts whole shares that differ by at most one and add up to it."""
    return [total // num_parts + (1 if i < total % num_parts else 0) for i in range(num_parts)]


class CoalescingTransport(httpx.AsyncBaseTransport):
    """httpx's default transport (HTTP/1.1, no proxy) with each request written in one send.

    Its connections are split over pools of at most `max_pool_connections` each: httpcore's pool scans every
    connection it holds on each request start and each stream close (for each idle one, all of them again), so
    one pool of thousands of streams costs CPU quadratic in them (~9% of an API replica's CPU at 1,000 streams,
    benchmarks/RESULTS.md). A request goes to the first pool with a free connection slot (all full: to the one
    with the fewest in flight, where it waits its turn), so the limit on connections holds for the transport as
    a whole and a light load uses the first pool only, reusing its idle connections as one pool would. Each
    pool keeps up to `max_keepalive_connections` idle.

    httpcore drops an idle connection the peer closed (or one past its keep-alive) only when its own pool is
    next used; so each request start also sweeps one other pool, in turn, and closes such connections there:
    a pool that a burst filled and no request uses since holds no connection in CLOSE_WAIT for long."""

    def __init__(
        self,
        limits: httpx.Limits = DEFAULT_LIMITS,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
        max_pool_connections: int = MAX_POOL_CONNECTIONS,
    ) -> None:
        max_connections = limits.max_connections
        num_pools = 1 if max_connections is None else max(1, -(-max_connections // max_pool_connections))
        self.max_in_flight: list[int | None] = (
            [None] if max_connections is None else list(shares(max_connections, num_pools))
        )
        backend = CoalescingBackend(network_backend)
        ssl_context = httpx.create_ssl_context()
        self._pools = [
            httpcore.AsyncConnectionPool(
                ssl_context=ssl_context,
                max_connections=self.max_in_flight[i],
                max_keepalive_connections=limits.max_keepalive_connections,
                keepalive_expiry=limits.keepalive_expiry,
                network_backend=backend,
            )
            for i in range(num_pools)
        ]
        self.num_in_flight = [0] * num_pools  # requests sent and not yet closed, per pool
        self._next_sweep = 0

    def _choose_pool(self) -> int:
        for index, (num, limit) in enumerate(zip(self.num_in_flight, self.max_in_flight, strict=True)):
            if limit is None or num < limit:
                return index
        return min(range(len(self._pools)), key=self.num_in_flight.__getitem__)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` through the first pool with room; the body streams as it arrives."""
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,  # type: ignore[arg-type]
            extensions=request.extensions,
        )
        index = self._choose_pool()
        await self._sweep_another(index)
        self.num_in_flight[index] += 1
        try:
            with _httpx_errors():
                response = await self._pools[index].handle_async_request(core_request)
        except BaseException:
            self.num_in_flight[index] -= 1
            raise
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream, lambda: self._release(index)),
            extensions=response.extensions,
        )

    def _release(self, index: int) -> None:
        self.num_in_flight[index] -= 1

    async def _sweep_another(self, in_use: int) -> None:
        """Close the idle connections of the next pool in turn (not `in_use`, which httpcore sweeps itself)
        that the peer closed or that outlived their keep-alive."""
        if len(self._pools) == 1:
            return
        index = self._next_sweep = (self._next_sweep + 1) % len(self._pools)
        if index == in_use:
            return
        for connection in self._pools[index].connections:
            # checked right before the close, which marks it closed before its first await: the pool cannot
            # hand it to a request in between (one event loop; an earlier close's await may have let it)
            if connection.is_idle() and connection.has_expired():
                await connection.aclose()

    async def aclose(self) -> None:
        """Close every pooled connection."""
        for pool in self._pools:
            await pool.aclose()
