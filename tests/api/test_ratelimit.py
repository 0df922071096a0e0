from collections.abc import Iterator
from typing import Any

import pytest

from api.ratelimit import SLOT_LEASE_S, InMemoryRateLimiter, RateLimiter, RateLimits, RedisRateLimiter
from tests.services import redis_with_prefix


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def limiter_and_clock(request: pytest.FixtureRequest) -> Iterator[tuple[RateLimiter, FakeClock]]:
    clock = FakeClock()
    if request.param == "memory":
        yield InMemoryRateLimiter(clock=clock), clock
        return
    gen = redis_with_prefix()
    client, prefix = next(gen)
    yield RedisRateLimiter(client, key_prefix=prefix, clock=clock), clock
    gen.close()


def test_refuses_request_over_requests_per_minute(limiter_and_clock: Any) -> None:
    limiter, _ = limiter_and_clock
    limits = RateLimits(max_requests_per_min=2)
    assert limiter.acquire("t1", 10, limits).is_allowed
    assert limiter.acquire("t1", 10, limits).is_allowed
    refused = limiter.acquire("t1", 10, limits)
    assert not refused.is_allowed
    assert 1 <= refused.retry_after_s <= 60
    assert "requests per minute" in refused.reason


def test_refused_request_consumes_no_tokens(limiter_and_clock: Any) -> None:
    limiter, _ = limiter_and_clock
    limits = RateLimits(max_tokens_per_min=100)
    assert limiter.acquire("t1", 60, limits).is_allowed
    assert not limiter.acquire("t1", 60, limits).is_allowed
    assert limiter.acquire("t1", 40, limits).is_allowed


def test_window_rolls_over_after_a_minute(limiter_and_clock: Any) -> None:
    limiter, clock = limiter_and_clock
    limits = RateLimits(max_requests_per_min=1)
    assert limiter.acquire("t1", 1, limits).is_allowed
    assert not limiter.acquire("t1", 1, limits).is_allowed
    clock.now += 60
    assert limiter.acquire("t1", 1, limits).is_allowed


def test_tenants_have_separate_budgets(limiter_and_clock: Any) -> None:
    limiter, _ = limiter_and_clock
    limits = RateLimits(max_requests_per_min=1)
    assert limiter.acquire("t1", 1, limits).is_allowed
    assert limiter.acquire("t2", 1, limits).is_allowed


def test_unlimited_plan_always_admits(limiter_and_clock: Any) -> None:
    limiter, _ = limiter_and_clock
    for _ in range(50):
        assert limiter.acquire("t1", 10_000, RateLimits()).is_allowed


class FlakyRedis:
    """A Redis client stand-in whose script fails while `is_down` (connection refused), else admits."""

    def __init__(self) -> None:
        self.is_down = False
        self.num_calls = 0

    def register_script(self, _source: str) -> Any:
        def script(keys: list[str], args: list[Any]) -> int:
            from redis.exceptions import ConnectionError as RedisConnectionError

            self.num_calls += 1
            if self.is_down:
                raise RedisConnectionError("Connection refused")
            return 0

        return script


def test_redis_outage_counts_in_process_instead_of_failing_then_returns_to_redis() -> None:
    client = FlakyRedis()
    limiter = RedisRateLimiter(client, clock=FakeClock())
    limits = RateLimits(max_requests_per_min=2)
    client.is_down = True
    assert limiter.acquire("t1", 1, limits).is_allowed and limiter.is_degraded
    assert limiter.acquire("t1", 1, limits).is_allowed
    assert not limiter.acquire("t1", 1, limits).is_allowed  # the budget still holds, per process
    client.is_down = False
    assert limiter.acquire("t1", 1, limits).is_allowed and not limiter.is_degraded  # Redis decides again
    assert client.num_calls == 4


def test_concurrent_request_slots_are_capped_per_tenant_and_released_once(limiter_and_clock: Any) -> None:
    limiter, _ = limiter_and_clock
    assert limiter.acquire_slot("t1", "r1", 2).is_allowed
    assert limiter.acquire_slot("t1", "r1", 2).is_allowed  # the same request again holds the same slot
    assert limiter.acquire_slot("t1", "r2", 2).is_allowed
    refused = limiter.acquire_slot("t1", "r3", 2)
    assert not refused.is_allowed and "max_concurrent_requests of 2" in refused.reason
    assert limiter.acquire_slot("t2", "r4", 2).is_allowed  # caps are per tenant
    limiter.release_slot("t1", "r1")
    limiter.release_slot("t1", "r1")  # a second release of the same request gives back nothing more
    assert limiter.num_held_slots("t1") == 1
    assert limiter.acquire_slot("t1", "r3", 2).is_allowed
    assert not limiter.acquire_slot("t1", "r5", 2).is_allowed


def test_a_slot_never_released_stops_counting_after_its_lease(limiter_and_clock: Any) -> None:
    limiter, clock = limiter_and_clock
    assert limiter.acquire_slot("t1", "lost", 1).is_allowed  # its API process was killed
    assert not limiter.acquire_slot("t1", "next", 1).is_allowed
    clock.now += SLOT_LEASE_S + 1
    assert limiter.acquire_slot("t1", "next", 1).is_allowed
