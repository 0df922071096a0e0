"""The rate limiter's checks from the event loop (`acquire_async`, `acquire_slot_async`): the same budgets as the
blocking checks, on a `redis.asyncio` client per loop, in process memory while Redis is down."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio

from api.ratelimit import InMemoryRateLimiter, RateLimiter, RateLimits
from api.redis_ratelimit import RedisRateLimiter
from tests.services import REDIS_URL, redis_with_prefix

NOW = 1_000_000.0


@pytest.fixture(params=["memory", "redis-thread", "redis-loop"])
def limiter(request: pytest.FixtureRequest) -> Iterator[RateLimiter]:
    if request.param == "memory":
        yield InMemoryRateLimiter(clock=lambda: NOW)
        return
    gen = redis_with_prefix()
    client, prefix = next(gen)
    make_async = (lambda: redis.asyncio.Redis.from_url(REDIS_URL)) if request.param == "redis-loop" else None
    yield RedisRateLimiter(client, key_prefix=prefix, clock=lambda: NOW, async_client=make_async)
    gen.close()


def test_checks_on_the_loop_share_the_budgets_of_the_blocking_checks(limiter: RateLimiter) -> None:
    limits = RateLimits(max_requests_per_min=3, max_tokens_per_min=100)

    async def run() -> list[bool]:
        first = await limiter.acquire_async("t1", 40, limits)
        second = await limiter.acquire_async("t1", 70, limits)  # over the tokens: refused, consumes nothing
        return [first.is_allowed, second.is_allowed]

    assert asyncio.run(run()) == [True, False]
    assert limiter.acquire("t1", 60, limits).is_allowed  # 40 + 60 = the whole budget
    refused = asyncio.run(limiter.acquire_async("t1", 1, limits))  # another loop: its own client
    assert not refused.is_allowed and "tokens per minute" in refused.reason
    assert not asyncio.run(limiter.acquire_async("t1", 0, RateLimits(max_requests_per_min=2))).is_allowed
    assert asyncio.run(limiter.acquire_async("t2", 100, limits)).is_allowed  # another tenant's budget


def test_slots_taken_on_the_loop_are_capped_and_released_by_the_blocking_release(
    limiter: RateLimiter,
) -> None:
    async def take(request_id: str) -> bool:
        return (await limiter.acquire_slot_async("t1", request_id, 2)).is_allowed

    assert [asyncio.run(take(r)) for r in ("a", "b", "c")] == [True, True, False]
    decision = asyncio.run(limiter.acquire_slot_async("t1", "c", 2))
    assert not decision.is_allowed and "max_concurrent_requests of 2" in decision.reason
    limiter.release_slot("t1", "a")
    assert asyncio.run(take("c"))


class DownRedis:
    """A `redis.asyncio` client whose scripts fail as an unreachable server does."""

    def register_script(self, source: str) -> Any:
        async def call(**_: Any) -> int:
            raise redis.ConnectionError("Connection refused")

        return call


def test_an_unreachable_redis_counts_in_process_on_the_loop_too() -> None:
    gen = redis_with_prefix()
    client, prefix = next(gen)
    try:
        limiter = RedisRateLimiter(client, key_prefix=prefix, clock=lambda: NOW, async_client=DownRedis)
        limits = RateLimits(max_requests_per_min=1)

        async def run() -> list[bool]:
            return [(await limiter.acquire_async("t1", 1, limits)).is_allowed for _ in range(2)]

        assert asyncio.run(run()) == [True, False]  # the budget still holds, in this process
        assert limiter.is_degraded
        assert not asyncio.run(limiter.acquire_slot_async("t1", "x", 0)).is_allowed
        assert limiter.acquire("t1", 1, limits).is_allowed and not limiter.is_degraded  # Redis answers again
    finally:
        gen.close()
