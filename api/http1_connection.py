"""One HTTP/1.1 client connection of api/http1_transport.py: an asyncio protocol that parses responses with
httptools as bytes arrive, holds their body chunks for the consumer and stops reading its socket while too many
are unread (backpressure).

A read timeout is one timer per connection, not one per wait: a stream waits for every token, and a timer armed
and cancelled per token (a handle, a future and, under uvloop, a libuv timer each) was most of what 1,000 waiting
streams held in the garbage collector's youngest generation (benchmarks/RESULTS.md). The timer stays armed across
waits and, when it fires early for the wait then in progress, is armed again for that wait's own deadline.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, cast

import httptools
import httpx

Origin = tuple[bytes, bytes, int]  # scheme, host, port


class Http1Connection(asyncio.Protocol):
    """One TCP (or TLS) connection carrying one request at a time; parses responses as bytes arrive."""

    def __init__(self, origin: Origin, max_buffered_bytes: int) -> None:
        self.origin = origin
        self.max_buffered_bytes = max_buffered_bytes
        self.transport: asyncio.Transport | None = None
        self.is_lost = False
        self.idle_since = 0.0
        self.on_lost: Any = None  # the pool's callback while the connection is idle
        self._parser: httptools.HttpResponseParser | None = None
        self._waiter: asyncio.Future[None] | None = None
        # the wait in progress: its deadline (loop time) and the error it fails with then; the one timer
        self._deadline: float | None = None
        self._timeout_error: type[httpx.TimeoutException] = httpx.ReadTimeout
        self._timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.status_code = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.is_headers_complete = False
        self.is_complete = False
        self.is_keep_alive = False
        self.error: httpx.TransportError | None = None
        self._chunks: deque[bytes] = deque()
        self._num_buffered = 0
        self._is_paused = False

    def start(self, request_bytes: bytes) -> None:
        """Send one request (the whole of it, in one write) and parse its response from here on."""
        assert self.transport is not None
        self._reset()
        self._parser = httptools.HttpResponseParser(self)
        self.transport.write(request_bytes)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        if self._parser is None:  # bytes while idle: the peer broke the protocol; never reuse
            self._fail(httpx.RemoteProtocolError("the worker sent bytes with no request outstanding"))
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"invalid HTTP response: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        if self._parser is not None and self.is_headers_complete and not self._has_framing():
            self.on_message_complete()  # a body without length or chunks ends with the connection
            self.is_keep_alive = False
        elif self._parser is not None and not self.is_complete:
            self._fail(
                httpx.RemoteProtocolError("the worker closed the connection before the response ended")
            )
        return False  # asyncio closes the socket

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_lost = True
        self.cancel_timer()
        if self._parser is not None and not self.is_complete:
            self._fail(httpx.ReadError(f"connection lost: {exc!r}" if exc else "connection lost"))
        if self.on_lost is not None:
            self.on_lost(self)

    def _has_framing(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" in names or b"transfer-encoding" in names

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self.status_code = self._parser.get_status_code()
        self.is_headers_complete = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._num_buffered += len(body)
        if (
            self._num_buffered > self.max_buffered_bytes
            and not self._is_paused
            and self.transport is not None
        ):
            self._is_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        assert self._parser is not None
        self.is_keep_alive = self._parser.should_keep_alive()
        self.is_complete = True
        self._parser = None
        self._wake()

    # the consumer's side
    def _fail(self, error: httpx.TransportError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, timeout: float | None, error: type[httpx.TimeoutException]) -> None:
        """Until something arrives (or fails); `error` after `timeout` seconds of nothing."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        if timeout is not None:
            self._deadline = loop.time() + timeout
            self._timeout_error = error
            if self._timer is None:
                self._timer = loop.call_at(self._deadline, self._on_timer)
        try:
            await waiter
        finally:
            self._waiter = None
            self._deadline = None

    def _on_timer(self) -> None:
        self._timer = None
        waiter, deadline = self._waiter, self._deadline
        if waiter is None or deadline is None or waiter.done():
            return  # no wait in progress: the next one arms the timer again
        loop = waiter.get_loop()
        if loop.time() >= deadline:
            waiter.set_exception(self._timeout_error("timed out waiting for the worker"))
        else:  # armed by an earlier wait: this one's deadline is later
            self._timer = loop.call_at(deadline, self._on_timer)

    def cancel_timer(self) -> None:
        """Disarm the read timer (the connection goes idle or closes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def take_chunk(self) -> bytes | None:
        """The oldest unread body bytes (None if none); reading resumes once the backlog is half drained."""
        if not self._chunks:
            return None
        chunk = self._chunks.popleft()
        self._num_buffered -= len(chunk)
        if (
            self._is_paused
            and self._num_buffered <= self.max_buffered_bytes // 2
            and self.transport is not None
        ):
            self._is_paused = False
            self.transport.resume_reading()
        return chunk

    @property
    def is_reusable(self) -> bool:
        """Read to its end, kept alive by the peer, and still open."""
        return (
            self.is_complete
            and self.is_keep_alive
            and self.error is None
            and not self.is_lost
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.cancel_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
