"""Per-tenant rate limits (requests/min and tokens/min) over a fixed one-minute window, and the cap on a
tenant's concurrent requests (a plan's max_concurrent_requests).

Two implementations behind one interface: `InMemoryRateLimiter` (embedded mode, one process) and
`RedisRateLimiter` (api/redis_ratelimit.py: every API replica shares the counters; one atomic Lua script per
check). The inference path checks with `acquire_async` / `acquire_slot_async`, which never block the event loop
and never hop to a thread (the Redis one runs its scripts on the loop's own asyncio connection).
A request is admitted only if BOTH budgets have room; a refused request consumes nothing. A caller may charge
the two apart (`num_requests=0` charges tokens only). The inference path charges every request that arrives,
whatever then becomes of it: an admitted one with its tokens in one check once it is sized (`admit_async`: a
refusal by the tokens budget still charges the request), one that fails before, alone
(api/request_charge.py); a tenant whose requests budget this process has seen spent in the current window is
refused on arrival without a check (`known_refusal`: exact, the window's count only grows).
While Redis is unreachable, `RedisRateLimiter` counts in process memory instead (each replica then enforces
the whole budget on its own, so the cluster admits up to one budget per replica) rather than failing the
request: a brief Redis outage must not stop inference. It returns to Redis once Redis answers.

Concurrent requests: `acquire_slot` takes one of the tenant's `max_concurrent_requests` slots for a request
id (refused, taking nothing, when all are held); `release_slot` gives it back and is idempotent, so a
request that ends several ways releases exactly once (api/metering.py releases it when the request's usage
is recorded, however it ended). A slot is a short lease renewed by its holder: `renew_slots` stamps every
slot a process still holds with the current time (api/metering.py's writer thread renews the slots of the
requests it holds open with their usage rows' leases, every quarter of the lease: one Redis round trip for
all), and a slot not renewed for `slot_lease_s` (settings.metering.lease_timeout_s, passed in where the
limiter is built: api/services.py) stops counting. So the slots of a killed API process (kill -9, OOM, node
loss) are free again within that lease, as are its usage rows. Renewal never re-creates a slot that was
released or has expired (ZADD XX). Over the cap a request is refused at once (429 naming the limit) rather
than queued: the cap is a stated limit of the plan, and waiting for it would hold a connection per queued
request. While Redis is unreachable, slots are taken, renewed and released in process memory, like the
counters.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

WINDOW_SECONDS = 60
# A held slot stops counting when its holder has not renewed it for this long (settings.metering.lease_timeout_s's
# default; api/services.py passes the configured value).
DEFAULT_SLOT_LEASE_S = 30.0


@dataclass(frozen=True)
class RateLimits:
    """A tenant's budgets per minute and its cap on requests in flight; None means unlimited."""

    max_requests_per_min: int | None = None
    max_tokens_per_min: int | None = None
    max_concurrent_requests: int | None = None  # requests in flight at once


@dataclass(frozen=True)
class RateDecision:
    """The outcome of one check."""

    is_allowed: bool
    retry_after_s: int = 0
    reason: str = ""


class RateLimiter(Protocol):
    """Checks and consumes a tenant's per-minute budgets atomically."""

    def acquire(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, *, num_requests: int = 1
    ) -> RateDecision:
        """Admit `num_requests` (1, or 0 to charge tokens only) costing num_tokens, or refuse them without
        consuming anything. With num_requests=0 the requests budget is neither checked nor charged."""
        ...

    def acquire_slot(self, tenant_id: str, request_id: str, max_concurrent_requests: int) -> RateDecision:
        """Hold one of the tenant's concurrent-request slots for request_id, or refuse taking nothing."""
        ...

    def release_slot(self, tenant_id: str, request_id: str) -> None:
        """Give the request's slot back (no-op when it holds none)."""
        ...

    def renew_slots(self, slots: Iterable[tuple[str, str]]) -> int:
        """Renew the lease of each held (tenant id, request id) slot (a released or expired one stays gone);
        returns how many were renewed."""
        ...

    async def acquire_async(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, *, num_requests: int = 1
    ) -> RateDecision:
        """`acquire` from the event loop without blocking it and without a thread (the inference path)."""
        ...

    async def admit_async(self, tenant_id: str, num_tokens: int, limits: RateLimits) -> RateDecision:
        """Charge one arriving request and its num_tokens in one check (the inference path's admission): refused
        by the requests budget, nothing is consumed; refused by the tokens budget, the request is charged (it
        arrived) and its tokens are not; else both are."""
        ...

    def known_refusal(self, tenant_id: str, max_requests_per_min: int | None) -> RateDecision | None:
        """The refusal a request of the tenant would get from the requests budget, when this process already
        knows it without a round trip (the window's budget seen spent), else None."""
        ...

    async def acquire_slot_async(
        self, tenant_id: str, request_id: str, max_concurrent_requests: int
    ) -> RateDecision:
        """`acquire_slot` from the event loop without blocking it and without a thread (the inference path)."""
        ...

    async def release_slot_async(self, tenant_id: str, request_id: str) -> None:
        """`release_slot` from the event loop without blocking it and without a thread (a request's end)."""
        ...

    async def aclose(self) -> None:
        """Close what the running event loop holds open (the app's shutdown)."""
        ...


def refusal(kind: str, limit: int, now: float) -> RateDecision:
    """A refusal by the per-minute budget of `kind` (requests or tokens), retried when the window rolls over."""
    retry = max(1, math.ceil(WINDOW_SECONDS - (now % WINDOW_SECONDS)))
    return RateDecision(False, retry, f"rate limit of {limit} {kind} per minute exceeded; retry in {retry} s")


def slot_refusal(limit: int) -> RateDecision:
    """A refusal by the cap on requests in flight, retried in a second."""
    return RateDecision(
        False,
        1,
        f"max_concurrent_requests of {limit} reached: {limit} requests of this tenant are in flight; retry when "
        "one finishes, or ask the operator for a plan with a higher max_concurrent_requests",
    )


class InMemoryRateLimiter:
    """Fixed-window counters in process memory (embedded mode)."""

    def __init__(
        self, clock: Callable[[], float] = time.time, *, slot_lease_s: float = DEFAULT_SLOT_LEASE_S
    ) -> None:
        self._clock = clock
        self.slot_lease_s = slot_lease_s
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[int, int, int]] = {}  # tenant -> (window, requests, tokens)
        self._slots: dict[str, dict[str, float]] = {}  # tenant -> {request id: when its slot was taken}

    def acquire(
        self,
        tenant_id: str,
        num_tokens: int,
        limits: RateLimits,
        *,
        num_requests: int = 1,
        is_request_kept: bool = False,
    ) -> RateDecision:
        """Admit `num_requests` (1, or 0 to charge tokens only) costing num_tokens, or refuse them without
        consuming anything (`is_request_kept`: a refusal by the tokens budget still charges the requests, as
        `admit_async` does)."""
        now = self._clock()
        window = int(now // WINDOW_SECONDS)
        with self._lock:
            start, num_counted, tokens = self._windows.get(tenant_id, (window, 0, 0))
            if start != window:
                num_counted, tokens = 0, 0
            max_requests = limits.max_requests_per_min
            if num_requests and max_requests is not None and num_counted + num_requests > max_requests:
                return refusal("requests", max_requests, now)
            if limits.max_tokens_per_min is not None and tokens + num_tokens > limits.max_tokens_per_min:
                if is_request_kept:
                    self._windows[tenant_id] = (window, num_counted + num_requests, tokens)
                return refusal("tokens", limits.max_tokens_per_min, now)
            self._windows[tenant_id] = (window, num_counted + num_requests, tokens + num_tokens)
        return RateDecision(True)

    async def admit_async(self, tenant_id: str, num_tokens: int, limits: RateLimits) -> RateDecision:
        """One request and its tokens in one check (RateLimiter.admit_async), inline."""
        return self.acquire(tenant_id, num_tokens, limits, is_request_kept=True)

    def known_refusal(self, tenant_id: str, max_requests_per_min: int | None) -> RateDecision | None:
        """The requests budget's refusal of one more request of the tenant now, from the counters (exact)."""
        if max_requests_per_min is None:
            return None
        now = self._clock()
        with self._lock:
            start, num_counted, _ = self._windows.get(tenant_id, (-1, 0, 0))
        if start == int(now // WINDOW_SECONDS) and num_counted + 1 > max_requests_per_min:
            return refusal("requests", max_requests_per_min, now)
        return None

    def acquire_slot(self, tenant_id: str, request_id: str, max_concurrent_requests: int) -> RateDecision:
        """Hold one of the tenant's concurrent-request slots for request_id, or refuse taking nothing."""
        now = self._clock()
        with self._lock:
            held = self._slots.setdefault(tenant_id, {})
            for expired in [rid for rid, taken in held.items() if taken <= now - self.slot_lease_s]:
                del held[expired]
            if request_id not in held and len(held) >= max_concurrent_requests:
                return slot_refusal(max_concurrent_requests)
            held[request_id] = now
        return RateDecision(True)

    def release_slot(self, tenant_id: str, request_id: str) -> None:
        """Give the request's slot back (no-op when it holds none)."""
        with self._lock:
            held = self._slots.get(tenant_id)
            if held is not None and held.pop(request_id, None) is not None and not held:
                del self._slots[tenant_id]

    def renew_slots(self, slots: Iterable[tuple[str, str]]) -> int:
        """Renew the lease of each held (tenant id, request id) slot (a released or expired one stays gone);
        returns how many were renewed."""
        now = self._clock()
        num_renewed = 0
        with self._lock:
            for tenant_id, request_id in slots:
                held = self._slots.get(tenant_id, {})
                taken = held.get(request_id)
                if taken is not None and taken > now - self.slot_lease_s:
                    held[request_id] = now
                    num_renewed += 1
        return num_renewed

    async def acquire_async(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, *, num_requests: int = 1
    ) -> RateDecision:
        """`acquire`, inline (it never waits)."""
        return self.acquire(tenant_id, num_tokens, limits, num_requests=num_requests)

    async def acquire_slot_async(
        self, tenant_id: str, request_id: str, max_concurrent_requests: int
    ) -> RateDecision:
        """`acquire_slot`, inline (it never waits)."""
        return self.acquire_slot(tenant_id, request_id, max_concurrent_requests)

    async def release_slot_async(self, tenant_id: str, request_id: str) -> None:
        """`release_slot`, inline (it never waits)."""
        self.release_slot(tenant_id, request_id)

    async def aclose(self) -> None:
        """Nothing to close."""

    def num_held_slots(self, tenant_id: str) -> int:
        """The tenant's slots that count now, leases not expired (tests and stats)."""
        now = self._clock()
        with self._lock:
            return sum(taken > now - self.slot_lease_s for taken in self._slots.get(tenant_id, {}).values())
