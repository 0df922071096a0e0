"""The rate limiter's Redis connection on the event loop: one client per loop, one pipelined connection that a
burst shares, the setting that bounds its commands in flight, and a wait past its limit told apart from an
outage."""

from __future__ import annotations

import asyncio
import uuid
from functools import partial
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio

from api.ratelimit import RateLimits
from api.redis_ratelimit import RedisRateLimiter, async_redis_client
from api.services import make_rate_limiter
from settings import Settings
from tests.redis_standin import HeldRedis
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


def test_a_burst_of_async_checks_shares_the_loops_one_redis_connection() -> None:
    # redis.asyncio's own pool opens a connection per concurrent command and keeps them all: a burst of 2,000
    # streams left 31-34 per API replica open for good; the pipelined client sends the whole burst down one
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
            assert sum(1 for conn in client.client_list() if conn.get("name") == name) == 1
        finally:
            await limiter.aclose()

    try:
        anyio.run(burst)
    finally:
        gen.close()


@pytest.mark.parametrize("max_connections", [3, 120])
def test_make_rate_limiter_bounds_the_loops_redis_commands_in_flight_by_the_setting(
    max_connections: int,
) -> None:
    # as many checks in flight as the setting says, on one connection; the ones beyond wait for a turn (answered
    # by Redis after, not counted as if it were down)
    async def burst() -> int:
        async with HeldRedis() as server:
            limiter = make_rate_limiter(Settings(redis_url=server.url, redis_max_connections=max_connections))
            assert isinstance(limiter, RedisRateLimiter)
            num_checks = max_connections + 7
            checks = asyncio.gather(
                *(limiter.acquire_async("t1", 0, RateLimits()) for _ in range(num_checks))
            )
            await server.wait_for_commands(max_connections)  # as many checks in flight, none answered yet
            num_in_flight = (
                server.num_commands
            )  # a check beyond the bound, were it sent, came in the same write
            server.release.set()
            decisions = await checks
            assert all(decision.is_allowed for decision in decisions) and not limiter.is_degraded
            await limiter.aclose()
            return num_in_flight, server.num_connections

    assert anyio.run(burst) == (max_connections, 1)


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
            await server.wait_for_commands(1)  # the first check holds the only turn
            assert (await limiter.acquire_async("t1", 0, limits)).is_allowed  # counted in this process
            assert limiter.num_pool_waits == 1 and not limiter.is_degraded
            server.release.set()
            assert (await first).is_allowed  # answered by Redis
            await limiter.aclose()

    with caplog.at_level("WARNING", logger="api.redis_ratelimit"):
        anyio.run(two_checks)
    assert "waited past their limit" in caplog.text and "unreachable" not in caplog.text
