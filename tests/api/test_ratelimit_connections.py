"""The rate limiter's Redis connections on the event loop: one client per loop, a bounded pool that a burst
waits for, the setting that bounds it, and a wait past its limit told apart from an outage."""

from __future__ import annotations

import asyncio
import uuid
from functools import partial
from typing import Any, Self

import anyio
import pytest
import redis
import redis.asyncio

from api.ratelimit import RateLimits
from api.redis_ratelimit import RedisRateLimiter, async_redis_client
from api.services import make_rate_limiter
from settings import Settings
from tests.services import REDIS_URL, redis_with_prefix

NOW = 1_000_000.0


def _clock() -> float:
    return NOW


def test_each_event_loop_checks_on_its_own_redis_connection() -> None:
    # an asyncio connection belongs to the loop that opened it (a test client's portal runs its own loop)
    gen = redis_with_prefix()
    client, prefix = next(gen)
    made: list[Any] = []

    def factory() -> Any:
        made.append(redis.asyncio.Redis.from_url(REDIS_URL))
        return made[-1]

    limiter = RedisRateLimiter(client, key_prefix=prefix, clock=_clock, async_client_factory=factory)
    limits = RateLimits(max_requests_per_min=3)

    async def two_checks() -> None:
        assert (await limiter.acquire_async("t1", 0, limits)).is_allowed
        assert (await limiter.acquire_async("t1", 0, limits)).is_allowed
        await limiter.aclose()

    try:
        anyio.run(two_checks)
        assert len(made) == 1  # one client for the loop's two checks
        with pytest.raises(AssertionError):
            anyio.run(two_checks)  # a second loop: its own client, on the same budget (3 per minute)
        assert len(made) == 2
    finally:
        gen.close()


def test_a_burst_of_async_checks_waits_for_the_loops_bounded_redis_connections() -> None:
    # redis.asyncio's own pool opens a connection per concurrent command and keeps them all: a burst of 2,000
    # streams left 31-34 per API replica open for good; a bounded pool makes the burst wait its turn instead
    gen = redis_with_prefix()
    client, prefix = next(gen)
    name = f"lorahost-test-{uuid.uuid4().hex}"  # this test's connections, among every client of the server
    limiter = RedisRateLimiter(
        client,
        key_prefix=prefix,
        clock=_clock,
        async_client_factory=partial(async_redis_client, REDIS_URL, 2, name),
    )
    limits = RateLimits(max_requests_per_min=30)

    async def burst() -> None:
        try:
            decisions = await asyncio.gather(*(limiter.acquire_async("t1", 0, limits) for _ in range(40)))
            assert sum(decision.is_allowed for decision in decisions) == 30  # every check counted, in Redis
            assert not limiter.is_degraded
            assert 1 <= sum(1 for conn in client.client_list() if conn.get("name") == name) <= 2
        finally:
            await limiter.aclose()

    try:
        anyio.run(burst)
    finally:
        gen.close()


@pytest.mark.parametrize("max_connections", [3, 120])
def test_make_rate_limiter_bounds_the_loops_redis_connections_by_the_setting(max_connections: int) -> None:
    # 120: above redis.asyncio's own pool size (100 unless told), which must get the setting too, or the checks
    # past 100 would be refused by the pool and counted as if Redis were down
    async def burst() -> int:
        async with HeldRedis() as server:
            limiter = make_rate_limiter(Settings(redis_url=server.url, redis_max_connections=max_connections))
            assert isinstance(limiter, RedisRateLimiter)
            num_checks = max_connections + 7
            checks = asyncio.gather(
                *(limiter.acquire_async("t1", 0, RateLimits()) for _ in range(num_checks))
            )
            await server.wait_for_connections(max_connections)  # as many checks in flight, none answered yet
            server.release.set()
            decisions = await checks
            assert all(decision.is_allowed for decision in decisions) and not limiter.is_degraded
            await limiter.aclose()
            return server.num_connections

    assert anyio.run(burst) == max_connections


def test_a_check_that_waits_too_long_for_a_connection_counts_in_process_without_calling_redis_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def two_checks() -> None:
        async with HeldRedis() as server:
            limiter = RedisRateLimiter(
                redis.Redis.from_url(server.url),  # the blocking client: unused here
                clock=_clock,
                async_client_factory=partial(async_redis_client, server.url, 1, wait_s=0.2),
            )
            limits = RateLimits(max_requests_per_min=1)
            first = asyncio.ensure_future(limiter.acquire_async("t1", 0, limits))
            await server.wait_for_connections(1)  # the first check holds the only connection
            assert (await limiter.acquire_async("t1", 0, limits)).is_allowed  # counted in this process
            assert limiter.num_pool_waits == 1 and not limiter.is_degraded
            server.release.set()
            assert (await first).is_allowed  # answered by Redis
            await limiter.aclose()

    with caplog.at_level("WARNING", logger="api.redis_ratelimit"):
        anyio.run(two_checks)
    assert "waited past their limit" in caplog.text and "unreachable" not in caplog.text


class HeldRedis:
    """A Redis stand-in on a local port answering every command (0 to a script, OK otherwise) only once
    `release` is set, so each command in flight holds its connection; counts the connections it accepted."""

    def __init__(self) -> None:
        self.num_connections = 0
        self.release = asyncio.Event()
        self._accepted = asyncio.Condition()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def wait_for_connections(self, num_connections: int) -> None:
        async with self._accepted:
            await self._accepted.wait_for(lambda: self.num_connections >= num_connections)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with self._accepted:
            self.num_connections += 1
            self._accepted.notify_all()
        try:
            while (command := await _read_resp_command(reader)) is not None:
                await self.release.wait()
                writer.write(b":0\r\n" if command[0].upper() in (b"EVAL", b"EVALSHA") else b"+OK\r\n")
                await writer.drain()
        finally:
            writer.close()


async def _read_resp_command(reader: asyncio.StreamReader) -> list[bytes] | None:
    """One command of the Redis protocol (an array of bulk strings), or None at the end of the stream."""
    header = await reader.readline()
    if not header:
        return None
    parts = []
    for _ in range(int(header[1:])):
        size = int((await reader.readline())[1:])
        parts.append((await reader.readexactly(size + 2))[:-2])
    return parts
