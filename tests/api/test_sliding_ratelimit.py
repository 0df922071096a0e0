"""The sliding-window limiter (the console's sign-in attempts): at most the limit in ANY window, across a
minute boundary too, in process memory and in Redis (shared by replicas), with an injected clock."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from api.ratelimit import InMemoryRateLimiter, RateLimits
from api.services import make_sign_in_limiter
from api.sliding_ratelimit import InMemorySlidingLimiter, RedisSlidingLimiter, SlidingWindowLimiter
from settings import Settings
from tests.api.test_ratelimit import FakeClock
from tests.services import redis_with_prefix

MINUTE_BOUNDARY = 1_000_020.0  # a multiple of 60: where a fixed window starts a new count


@pytest.fixture(params=["memory", "redis"])
def limiter_and_clock(request: pytest.FixtureRequest) -> Iterator[tuple[SlidingWindowLimiter, FakeClock]]:
    clock = FakeClock(MINUTE_BOUNDARY - 1.0)
    if request.param == "memory":
        yield InMemorySlidingLimiter(clock), clock
        return
    gen: Generator[tuple[Any, str]] = redis_with_prefix()  # type: ignore[assignment]
    client, prefix = next(gen)
    yield RedisSlidingLimiter(client, key_prefix=prefix, clock=clock), clock
    gen.close()


def test_a_burst_across_the_minute_boundary_gets_the_limit_not_twice_it(
    limiter_and_clock: tuple[SlidingWindowLimiter, FakeClock],
) -> None:
    limiter, clock = limiter_and_clock
    assert MINUTE_BOUNDARY % 60 == 0
    assert [limiter.acquire("a", 3).is_allowed for _ in range(3)] == [True, True, True]
    clock.now = MINUTE_BOUNDARY + 1.0  # a new calendar minute, 2 s after the burst
    refused = limiter.acquire("a", 3)
    assert not refused.is_allowed
    assert refused.retry_after_s == 58  # the oldest attempt leaves the window 60 s after it was made
    assert limiter.acquire("b", 3).is_allowed  # per key


def test_an_attempt_is_admitted_again_once_the_oldest_leaves_the_window(
    limiter_and_clock: tuple[SlidingWindowLimiter, FakeClock],
) -> None:
    limiter, clock = limiter_and_clock
    start = clock.now
    for offset in (0.0, 10.0, 20.0):
        clock.now = start + offset
        assert limiter.acquire("a", 3).is_allowed
    clock.now = start + 59.0
    assert not limiter.acquire("a", 3).is_allowed  # refused attempts are not logged...
    clock.now = start + 60.0
    assert limiter.acquire("a", 3).is_allowed  # ...so the first one's slot is free at +60 s
    assert not limiter.acquire("a", 3).is_allowed
    clock.now = start + 70.0
    assert limiter.acquire("a", 3).is_allowed


def test_the_fixed_window_limiter_would_admit_twice_the_limit_there() -> None:
    """Why the console does not use api/ratelimit.py's per-tenant limiter for sign-ins."""
    clock = FakeClock(MINUTE_BOUNDARY - 1.0)
    fixed = InMemoryRateLimiter(clock)
    limits = RateLimits(max_requests_per_min=3)
    admitted = [fixed.acquire("a", 0, limits).is_allowed for _ in range(3)]
    clock.now = MINUTE_BOUNDARY + 1.0
    admitted += [fixed.acquire("a", 0, limits).is_allowed for _ in range(3)]
    assert admitted == [True] * 6


def test_replicas_share_the_log_in_redis() -> None:
    for client, prefix in redis_with_prefix():
        clock = FakeClock()
        one, two = (RedisSlidingLimiter(client, key_prefix=prefix, clock=clock) for _ in range(2))
        assert one.acquire("a", 2).is_allowed and two.acquire("a", 2).is_allowed
        assert not one.acquire("a", 2).is_allowed and not two.acquire("a", 2).is_allowed


class _DownRedis:
    def register_script(self, _: str) -> object:
        def fail(**_: object) -> None:
            raise RedisConnectionError("down")

        return fail


def test_while_redis_is_down_the_limit_is_kept_in_process() -> None:
    limiter = RedisSlidingLimiter(_DownRedis(), clock=FakeClock())
    assert [limiter.acquire("a", 2).is_allowed for _ in range(3)] == [True, True, False]
    assert limiter.is_degraded


def test_the_services_use_redis_when_configured(redis_url: str) -> None:
    assert isinstance(make_sign_in_limiter(Settings(redis_url=None)), InMemorySlidingLimiter)
    assert isinstance(make_sign_in_limiter(Settings(redis_url=redis_url)), RedisSlidingLimiter)
