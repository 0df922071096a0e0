"""One event loop's pipelined connection to Redis, for the rate limiter's checks on the request path.

Every command of the loop goes down one connection without waiting for the answers of those before it; the
commands issued in the same turn of the loop leave in one write, and the answers come back in order, each
resolving its command's future. redis.asyncio's client spent 107-133 us of the loop's CPU per check (a pooled
connection checked out and in, its own reader task, a write and a read system call each); this one spends a
fraction of that, and a burst of checks shares its system calls (benchmarks/redis_checks.py,
benchmarks/RESULTS.md). Only what the limiter sends is spoken: commands of bulk strings, answers of RESP2.

Failures are redis-py's exceptions, so the limiter's handling (count in the process while Redis is unreachable)
applies unchanged: a refused or lost connection fails every command in flight with ConnectionError; a command
unanswered within `timeout_s` fails with TimeoutError and drops the connection (the answers after it could no
longer be matched); an error answer is a ResponseError (NoScriptError for a script Redis does not hold, which
`PipelinedScript` answers by sending the script itself). After a failed connect the next one is tried only
`reconnect_interval_s` later, the commands meanwhile failing at once: an unreachable Redis costs a request no
wait. At most `max_in_flight` commands are in flight; one beyond waits for a turn up to `turn_wait_s`, then fails
with ConnectionError "No connection available" caused by a TimeoutError (api/redis_ratelimit.py is_pool_wait).
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_RECONNECT_INTERVAL_S = 0.5

Reply = int | bytes | list[Any] | None


class _Incomplete(Exception):
    """The buffer ends inside an answer: wait for more bytes."""


def encode_command(args: Sequence[str | bytes | int | float]) -> bytes:
    """One command in the Redis protocol: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def parse_reply(buf: bytes | bytearray, pos: int) -> tuple[Reply | ResponseError, int]:
    """The RESP2 answer starting at buf[pos] and the position after it; _Incomplete when buf ends inside it.
    An error answer is returned (not raised) as a ResponseError."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind, line = buf[pos], bytes(buf[pos + 1 : end])
    pos = end + 2
    if kind == 0x3A:  # ':' integer
        return int(line), pos
    if kind == 0x2B:  # '+' simple string
        return line, pos
    if kind == 0x2D:  # '-' error
        message = line.decode(errors="replace")
        return (NoScriptError if message.startswith("NOSCRIPT") else ResponseError)(message), pos
    if kind == 0x24:  # '$' bulk string of the given length, -1 for nil
        size = int(line)
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            raise _Incomplete
        return bytes(buf[pos : pos + size]), pos + size + 2
    if kind == 0x2A:  # '*' array of the given length, -1 for nil
        size = int(line)
        if size < 0:
            return None, pos
        items: list[Any] = []
        for _ in range(size):
            item, pos = parse_reply(buf, pos)
            items.append(item)
        return items, pos
    raise RedisConnectionError(f"Redis answered something not in its protocol: {bytes(buf[pos - 2 : pos])!r}")


class _RedisProtocol(asyncio.Protocol):
    """The connection: commands written in order, each answer resolving the oldest unanswered command."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending: deque[asyncio.Future[Reply]] = deque()
        self._buffer = bytearray()
        self._outgoing: list[bytes] = []
        self._is_flush_scheduled = False
        self.lost_reason: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def send(self, command: bytes) -> asyncio.Future[Reply]:
        """Queue one encoded command; the commands of one turn of the loop leave in one write."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self.pending.append(future)
        self._outgoing.append(command)
        if not self._is_flush_scheduled:
            self._is_flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._is_flush_scheduled = False
        if self.transport is not None and not self.transport.is_closing() and self._outgoing:
            self.transport.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        pos = 0
        try:
            while pos < len(self._buffer):
                reply, pos = parse_reply(self._buffer, pos)
                if not self.pending:
                    raise RedisConnectionError("Redis answered a command that was not sent")
                future = self.pending.popleft()
                if not future.done():  # one whose caller timed out is gone with the connection anyway
                    if isinstance(reply, ResponseError):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
        except _Incomplete:
            pass
        except RedisConnectionError as exc:
            self.fail(exc)
            return
        del self._buffer[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RedisConnectionError(f"Connection to Redis lost: {exc or 'closed by the server'}"))

    def fail(self, exc: BaseException) -> None:
        """Close the connection and fail every command still waiting for its answer with exc."""
        if self.lost_reason is None:
            self.lost_reason = exc
        if self.transport is not None:
            self.transport.abort()
        while self.pending:
            future = self.pending.popleft()
            if not future.done():
                future.set_exception(self.lost_reason)
        self._outgoing.clear()

    @property
    def is_open(self) -> bool:
        """Whether commands can still be sent on this connection."""
        return self.lost_reason is None and self.transport is not None and not self.transport.is_closing()


class PipelinedRedis:
    """A pipelined Redis connection owned by one event loop (the limiter keeps one per loop): `execute_command`,
    `zrem` and scripts from `register_script`, the methods of redis.asyncio.Redis the limiter calls."""

    def __init__(
        self,
        url: str,
        *,
        max_in_flight: int = 32,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        turn_wait_s: float = DEFAULT_TIMEOUT_S,
        reconnect_interval_s: float = DEFAULT_RECONNECT_INTERVAL_S,
        client_name: str | None = None,
    ) -> None:
        self._options: dict[str, Any] = dict(parse_url(url))
        self._client_name = client_name
        self._timeout_s = timeout_s
        self._turn_wait_s = turn_wait_s
        self._reconnect_interval_s = reconnect_interval_s
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._protocol: _RedisProtocol | None = None
        self._connecting: asyncio.Future[_RedisProtocol] | None = None
        self._connect_failed_at = -reconnect_interval_s
        self._connect_error: BaseException | None = None
        self.num_connects = 0  # connections opened so far (tests, stats)

    async def execute_command(self, *args: str | bytes | float) -> Reply:
        """Send one command and return its answer (redis-py's exceptions on failure, as the module says)."""
        if self._in_flight.locked():  # every turn taken: wait for one, bounded
            try:
                async with asyncio.timeout(self._turn_wait_s):
                    await self._in_flight.acquire()
            except TimeoutError as exc:
                raise RedisConnectionError("No connection available.") from exc
        else:
            await self._in_flight.acquire()  # a free turn: returns without suspending
        try:
            protocol = self._protocol if self._protocol is not None and self._protocol.is_open else None
            if protocol is None:
                protocol = await self._connection()
            return await self._answer(protocol, protocol.send(encode_command(args)))
        finally:
            self._in_flight.release()

    async def zrem(self, key: str, *members: str) -> Reply:
        """ZREM key member..."""
        return await self.execute_command("ZREM", key, *members)

    def register_script(self, source: str) -> PipelinedScript:
        """A Lua script called by its SHA1 (sent whole once Redis says it does not hold it)."""
        return PipelinedScript(self, source)

    async def aclose(self) -> None:
        """Close the connection; commands in flight fail with ConnectionError (a later command reconnects)."""
        if self._protocol is not None:
            self._protocol.fail(RedisConnectionError("Connection to Redis closed by the client"))
            self._protocol = None

    async def _answer(self, protocol: _RedisProtocol, future: asyncio.Future[Reply]) -> Reply:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await future
        except TimeoutError as exc:
            error = RedisTimeoutError(f"Redis did not answer within {self._timeout_s} s")
            protocol.fail(error)  # the answers after this one could no longer be matched to their commands
            raise error from exc

    async def _connection(self) -> _RedisProtocol:
        if self._connecting is None:
            if time.monotonic() - self._connect_failed_at < self._reconnect_interval_s:
                raise RedisConnectionError(f"Redis unreachable (retrying shortly): {self._connect_error}")
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> _RedisProtocol:
        loop = asyncio.get_running_loop()
        options = self._options
        try:
            async with asyncio.timeout(self._timeout_s):
                if options.get("connection_class") is UnixDomainSocketConnection:
                    _, protocol = await loop.create_unix_connection(_RedisProtocol, options["path"])
                else:
                    tls = _tls_context(options) if options.get("connection_class") is SSLConnection else None
                    _, protocol = await loop.create_connection(
                        _RedisProtocol,
                        options.get("host", "localhost"),
                        int(options.get("port", 6379)),
                        ssl=tls,
                    )
                await asyncio.gather(
                    *(self._answer(protocol, protocol.send(encode_command(c))) for c in self._handshake())
                )
        except (OSError, TimeoutError, RedisConnectionError, ResponseError) as exc:
            self._connect_failed_at = time.monotonic()
            self._connect_error = exc
            # not chained: a ConnectionError caused by a TimeoutError is a wait for a turn (is_pool_wait)
            raise RedisConnectionError(f"Error connecting to Redis: {exc!r}") from None
        self.num_connects += 1
        self._protocol = protocol
        return protocol

    def _handshake(self) -> list[list[str | int]]:
        """The commands a new connection sends first: AUTH, SELECT, CLIENT SETNAME, as the URL and name say."""
        options = self._options
        commands: list[list[str | int]] = []
        if options.get("password"):
            user = options.get("username")
            commands.append(["AUTH", user, options["password"]] if user else ["AUTH", options["password"]])
        if int(options.get("db") or 0):
            commands.append(["SELECT", int(options["db"])])
        if self._client_name:
            commands.append(["CLIENT", "SETNAME", self._client_name])
        return commands


class PipelinedScript:
    """A registered Lua script: called with keys and args, by EVALSHA, falling back to EVAL when Redis does not
    hold it (restarted, flushed), which also loads it for the calls after."""

    def __init__(self, client: PipelinedRedis, source: str) -> None:
        self._client = client
        self._source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> Reply:
        """The script's answer for these keys and arguments."""
        try:
            return await self._client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self._client.execute_command("EVAL", self._source, len(keys), *keys, *args)


def _tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    """The TLS context of a rediss:// URL (its ssl_ca_certs, ssl_cert_reqs, ssl_check_hostname)."""
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    cert_reqs = options.get("ssl_cert_reqs", "required")
    if isinstance(cert_reqs, str):
        cert_reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL}.get(cert_reqs, ssl.CERT_REQUIRED)
    if cert_reqs == ssl.CERT_NONE or not options.get("ssl_check_hostname", True):
        context.check_hostname = False
    context.verify_mode = cert_reqs
    return context
