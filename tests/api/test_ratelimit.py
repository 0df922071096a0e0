from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis.asyncio

from api.ratelimit import DEFAULT_SLOT_LEASE_S, InMemoryRateLimiter, RateLimiter, RateLimits
from api.redis_ratelimit import RedisRateLimiter, async_redis_client
from api.services import make_rate_limiter
from settings import Settings
from tests.services import REDIS_URL, redis_with_prefix


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis", "redis-pipelined"])
def limiter_and_clock(request: pytest.FixtureRequest) -> Iterator[tuple[RateLimiter, FakeClock]]:
    """Each limiter with a fake clock; the Redis one with redis-py's async client and with the API's own (one
    pipelined connection: api/redis_pipeline.py)."""
    clock = FakeClock()
    if request.param == "memory":
        yield InMemoryRateLimiter(clock=clock), clock
        return
    gen = redis_with_prefix()
    client, prefix = next(gen)
    async_client: Any = (
        partial(async_redis_client, REDIS_URL, 32)
        if request.param == "redis-pipelined"
        else partial(redis.asyncio.Redis.from_url, REDIS_URL)
    )
    yield RedisRateLimiter(client, key_prefix=prefix, clock=clock, async_client_factory=async_client), clock
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


def test_a_tokens_only_charge_neither_checks_nor_counts_requests(limiter_and_clock: Any) -> None:
    limiter, _ = limiter_and_clock
    limits = RateLimits(max_requests_per_min=1, max_tokens_per_min=100)
    assert limiter.acquire("t1", 0, limits).is_allowed  # the request, charged on arrival
    assert limiter.acquire("t1", 60, limits, num_requests=0).is_allowed  # its tokens, once sized
    refused = limiter.acquire("t1", 60, limits, num_requests=0)
    assert not refused.is_allowed and "tokens per minute" in refused.reason
    assert limiter.acquire("t1", 40, limits, num_requests=0).is_allowed
    assert "requests per minute" in limiter.acquire("t1", 0, limits).reason  # still one request counted


def test_the_async_checks_share_the_budgets_and_slots_of_the_blocking_ones_without_a_thread(
    limiter_and_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the inference path's checks: on the event loop itself (a thread hop waits for the interpreter lock)
    limiter, _ = limiter_and_clock

    def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an async check hopped to a worker thread")

    monkeypatch.setattr(anyio.to_thread, "run_sync", no_thread)
    limits = RateLimits(max_requests_per_min=2, max_tokens_per_min=100)

    async def checks() -> None:
        try:
            assert (await limiter.acquire_async("t1", 0, limits)).is_allowed
            assert limiter.acquire("t1", 0, limits).is_allowed  # the same counters
            refused = await limiter.acquire_async("t1", 0, limits)
            assert not refused.is_allowed and "requests per minute" in refused.reason
            assert (await limiter.acquire_async("t1", 60, limits, num_requests=0)).is_allowed
            assert not (await limiter.acquire_async("t1", 60, limits, num_requests=0)).is_allowed
            assert (await limiter.acquire_slot_async("t1", "r1", 1)).is_allowed
            refused = await limiter.acquire_slot_async("t1", "r2", 1)
            assert not refused.is_allowed and "max_concurrent_requests" in refused.reason
            await limiter.release_slot_async("t1", "r1")
            assert (await limiter.acquire_slot_async("t1", "r2", 1)).is_allowed
            await limiter.release_slot_async("t1", "r2")
            assert limiter.acquire_slot("t1", "r3", 1).is_allowed  # the blocking check sees it released
        finally:
            await limiter.aclose()

    anyio.run(checks)


def test_an_async_check_counts_in_process_while_redis_is_down() -> None:
    flaky = FlakyRedis()
    limiter = RedisRateLimiter(
        FlakyRedis(), clock=FakeClock(), async_client_factory=lambda: FlakyAsyncRedis(flaky)
    )
    limits = RateLimits(max_requests_per_min=1)

    async def checks() -> None:
        flaky.is_down = True
        assert (await limiter.acquire_async("t1", 0, limits)).is_allowed and limiter.is_degraded
        assert not (await limiter.acquire_async("t1", 0, limits)).is_allowed  # the budget holds, per process
        assert (await limiter.acquire_slot_async("t1", "r1", 1)).is_allowed
        await limiter.release_slot_async("t1", "r1")  # an outage does not fail the request's end
        assert (await limiter.acquire_slot_async("t1", "r2", 1)).is_allowed  # released in process
        flaky.is_down = False
        assert (await limiter.acquire_async("t1", 0, limits)).is_allowed and not limiter.is_degraded
        await limiter.aclose()

    anyio.run(checks)


class FlakyAsyncRedis:
    """FlakyRedis behind redis.asyncio's interface (awaitable scripts)."""

    def __init__(self, flaky: FlakyRedis) -> None:
        self.flaky = flaky

    def register_script(self, source: str) -> Any:
        script = self.flaky.register_script(source)

        async def run(keys: list[str], args: list[Any]) -> int:
            return int(script(keys=keys, args=args))

        return run

    async def zrem(self, key: str, member: str) -> int:
        return self.flaky.zrem(key, member)

    async def aclose(self) -> None:
        pass


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

    def zrem(self, _key: str, _member: str) -> int:
        from redis.exceptions import ConnectionError as RedisConnectionError

        if self.is_down:
            raise RedisConnectionError("Connection refused")
        return 0


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
    clock.now += DEFAULT_SLOT_LEASE_S + 1
    assert limiter.acquire_slot("t1", "next", 1).is_allowed


def test_a_renewed_slot_keeps_counting_and_one_not_renewed_expires_after_the_lease(
    limiter_and_clock: Any,
) -> None:
    limiter, clock = limiter_and_clock
    lease_s = DEFAULT_SLOT_LEASE_S
    assert limiter.acquire_slot("t1", "renewed", 2).is_allowed
    assert limiter.acquire_slot("t1", "abandoned", 2).is_allowed
    for _ in range(5):  # five leases' worth of time, renewed every 0.5 lease
        clock.now += lease_s / 2
        assert limiter.renew_slots([("t1", "renewed")]) == 1
    assert limiter.num_held_slots("t1") == 1  # "abandoned" ran out; "renewed" still counts
    assert limiter.acquire_slot("t1", "next", 2).is_allowed
    assert not limiter.acquire_slot("t1", "over", 2).is_allowed  # "renewed" + "next": the cap holds


def test_renewal_never_brings_back_a_released_or_expired_slot(limiter_and_clock: Any) -> None:
    limiter, clock = limiter_and_clock
    assert limiter.acquire_slot("t1", "released", 1).is_allowed
    limiter.release_slot("t1", "released")
    assert (
        limiter.renew_slots([("t1", "released"), ("t2", "never-taken")]) == 0
    )  # a renewal racing the release
    assert limiter.num_held_slots("t1") == 0
    assert limiter.acquire_slot("t1", "expired", 1).is_allowed
    clock.now += DEFAULT_SLOT_LEASE_S
    assert limiter.renew_slots([("t1", "expired")]) == 0  # renewed too late: it stays expired
    assert limiter.acquire_slot("t1", "next", 1).is_allowed
    assert limiter.renew_slots([]) == 0


def test_the_slot_lease_is_the_configured_one(limiter_and_clock: Any) -> None:
    _, clock = limiter_and_clock
    limiter = InMemoryRateLimiter(clock, slot_lease_s=5.0)
    assert limiter.acquire_slot("t1", "a", 1).is_allowed
    clock.now += 4.0
    assert not limiter.acquire_slot("t1", "b", 1).is_allowed
    clock.now += 1.0
    assert limiter.acquire_slot("t1", "b", 1).is_allowed


def test_slots_of_a_killed_api_process_free_up_after_the_usage_lease_so_the_tenant_is_admitted_again() -> (
    None
):
    """Regression (issue 19): a replica killed mid-request left its slots held for an hour (429s for the tenant).
    Two replicas built from settings share Redis; the dead one never renews, the live one does."""
    gen = redis_with_prefix()
    _, prefix = next(gen)
    clock = FakeClock()
    settings = Settings(redis_url=REDIS_URL, celery_key_prefix=prefix, usage_lease_timeout_s=30.0)
    dead, live = make_rate_limiter(settings, clock), make_rate_limiter(settings, clock)
    try:
        assert dead.acquire_slot("t1", "in-flight-at-crash", 2).is_allowed  # then its process is killed
        assert live.acquire_slot("t1", "long-stream", 2).is_allowed
        assert not live.acquire_slot("t1", "next", 2).is_allowed  # the tenant is at its cap
        for _ in range(4):  # the live replica renews every checkpoint interval; the dead one never does
            clock.now += 10.0
            assert live.renew_slots([("t1", "long-stream")]) == 1
        assert live.acquire_slot("t1", "next", 2).is_allowed  # the dead replica's slot stopped counting
        assert not live.acquire_slot("t1", "over", 2).is_allowed  # the renewed one still counts
    finally:
        gen.close()


def test_redis_outage_renews_the_slots_taken_in_process() -> None:
    client = FlakyRedis()
    clock = FakeClock()
    limiter = RedisRateLimiter(client, clock=clock, slot_lease_s=10.0)
    client.is_down = True
    assert limiter.acquire_slot("t1", "during-outage", 1).is_allowed
    clock.now += 8.0
    assert limiter.renew_slots([("t1", "during-outage")]) == 1  # in the fallback; the Redis call failed
    clock.now += 8.0
    assert not limiter.acquire_slot("t1", "next", 1).is_allowed  # renewed: still counts
    limiter.release_slot("t1", "during-outage")
    assert limiter.acquire_slot("t1", "next", 1).is_allowed
