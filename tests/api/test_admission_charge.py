"""A request and its tokens charged in one check at admission (`admit_async`), a refusal already known without a
check (`known_refusal`), and a request that fails before admission charged alone, once (`charged_once`)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from api.errors import ApiError
from api.ratelimit import InMemoryRateLimiter, RateDecision, RateLimits
from api.redis_ratelimit import RedisRateLimiter
from api.request_charge import charged_once
from tests.api.test_ratelimit import FakeClock, FlakyRedis, limiter_and_clock

__all__ = ["limiter_and_clock"]  # the fixture, parametrized over every limiter


def test_admission_charges_the_request_and_its_tokens_in_one_check(limiter_and_clock: Any) -> None:
    limiter, _ = limiter_and_clock
    limits = RateLimits(max_requests_per_min=3, max_tokens_per_min=100)

    async def admissions() -> list[str]:
        return [
            (await limiter.admit_async("t1", num_tokens, limits)).reason or "ok"
            for num_tokens in (60, 60, 40, 1)  # the second is refused by tokens but counted as a request
        ]

    reasons = anyio.run(admissions)
    assert reasons[0] == "ok" and "tokens per minute" in reasons[1] and reasons[2] == "ok"
    assert "requests per minute" in reasons[3]  # 3 requests counted: the refused one among them
    assert (
        "requests per minute" in limiter.acquire("t1", 0, limits).reason
    )  # nothing consumed by that refusal
    assert limiter.acquire("t1", 0, RateLimits(max_tokens_per_min=100), num_requests=0).is_allowed  # 100 used


def test_a_spent_requests_budget_is_known_without_a_check_until_the_window_rolls_over(
    limiter_and_clock: Any,
) -> None:
    limiter, clock = limiter_and_clock
    limits = RateLimits(max_requests_per_min=2)
    assert limiter.known_refusal("t1", 2) is None
    assert limiter.acquire("t1", 0, limits).is_allowed and limiter.acquire("t1", 0, limits).is_allowed
    assert not limiter.acquire("t1", 0, limits).is_allowed  # this process sees the budget spent
    known = limiter.known_refusal("t1", 2)
    assert known is not None and not known.is_allowed and "requests per minute" in known.reason
    assert 1 <= known.retry_after_s <= 60
    assert limiter.known_refusal("t1", 1) is not None  # a lower limit: spent too
    assert limiter.known_refusal("t1", 5) is None  # a raised limit (a plan change): ask
    assert limiter.known_refusal("t2", 2) is None  # per tenant
    assert limiter.known_refusal("t1", None) is None  # unlimited
    clock.now += 60
    assert limiter.known_refusal("t1", 2) is None


def test_a_redis_limiter_knows_a_refusal_only_from_an_answer_and_from_its_counts_while_degraded() -> None:
    flaky = FlakyRedis()
    limiter = RedisRateLimiter(flaky, clock=FakeClock())
    limits = RateLimits(max_requests_per_min=1)
    flaky.is_down = True
    assert limiter.acquire("t1", 0, limits).is_allowed and limiter.is_degraded  # counted in this process
    assert limiter.known_refusal("t1", 1) is not None  # from the in-process count
    flaky.is_down = False
    assert limiter.acquire("t2", 0, limits).is_allowed and not limiter.is_degraded
    assert limiter.known_refusal("t1", 1) is None  # Redis decides again: never seen refused there


class CountingLimiter(InMemoryRateLimiter):
    """The in-memory limiter, counting the requests charged through it; `is_knowing` False: it never knows a
    refusal in advance (a replica whose peers spent the budget in Redis)."""

    def __init__(self, *, is_knowing: bool = True) -> None:
        super().__init__(clock=FakeClock())
        self.num_request_charges = 0
        self.is_knowing = is_knowing

    def acquire(self, *args: Any, **kwargs: Any) -> RateDecision:
        self.num_request_charges += kwargs.get("num_requests", 1) > 0
        return super().acquire(*args, **kwargs)

    def known_refusal(self, tenant_id: str, max_requests_per_min: int | None) -> RateDecision | None:
        return super().known_refusal(tenant_id, max_requests_per_min) if self.is_knowing else None


def _through_admission(limiter: CountingLimiter, fail: BaseException | None, is_admitted: bool) -> None:
    async def request() -> None:
        async with charged_once(limiter, "t1", 2) as charge:
            if is_admitted:
                decision = await limiter.admit_async("t1", 5, RateLimits(max_requests_per_min=2))
                charge.is_charged = True
                assert decision.is_allowed
            if fail is not None:
                raise fail

    anyio.run(request)


@pytest.mark.parametrize("is_knowing", [True, False])
def test_a_request_is_charged_once_whether_admitted_or_failing_before_admission(is_knowing: bool) -> None:
    limiter = CountingLimiter(is_knowing=is_knowing)
    _through_admission(limiter, None, is_admitted=True)
    assert limiter.num_request_charges == 1
    with pytest.raises(ApiError, match="bad body"):
        _through_admission(limiter, ApiError(400, "invalid_request", "bad body"), is_admitted=False)
    assert limiter.num_request_charges == 2  # charged alone as it failed
    with pytest.raises(ApiError) as refused:  # the budget of 2 is spent: 429, not the failure's 400
        _through_admission(limiter, ApiError(400, "invalid_request", "bad body"), is_admitted=False)
    assert refused.value.status_code == 429 and refused.value.headers["Retry-After"]
    # known spent: refused on arrival without a check; else asked as it failed, refused (consuming nothing)
    assert limiter.num_request_charges == (2 if is_knowing else 3)


def test_a_request_failing_after_admission_or_cancelled_before_it_is_charged_once() -> None:
    limiter = CountingLimiter()
    with pytest.raises(RuntimeError):
        _through_admission(limiter, RuntimeError("after admission"), is_admitted=True)
    assert limiter.num_request_charges == 1

    async def cancelled() -> None:
        with anyio.CancelScope() as scope:
            async with charged_once(limiter, "t1", 10):
                scope.cancel()  # the client left while the request was being prepared
                await anyio.sleep(1)

    anyio.run(cancelled)
    assert limiter.num_request_charges == 2
