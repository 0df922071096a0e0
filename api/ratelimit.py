"""Per-tenant rate limits (requests/min and tokens/min) over a fixed one-minute window, and the cap on a
tenant's concurrent requests (a plan's max_concurrent_requests).

Two implementations behind one interface: `InMemoryRateLimiter` (embedded mode, one process) and
`RedisRateLimiter` (distributed: every API replica shares the counters; one atomic Lua script per check).
A request is admitted only if BOTH budgets have room; a refused request consumes nothing. A caller may charge
the two apart (`num_requests=0` charges tokens only): the inference path charges the request on arrival,
whatever then becomes of it, and its tokens once it is sized (api/request_charge.py, api/inference/prepare.py).
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
from typing import Any, Protocol

from redis.exceptions import RedisError

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


def _refusal(kind: str, limit: int, now: float) -> RateDecision:
    retry = max(1, math.ceil(WINDOW_SECONDS - (now % WINDOW_SECONDS)))
    return RateDecision(False, retry, f"rate limit of {limit} {kind} per minute exceeded; retry in {retry} s")


def _slot_refusal(limit: int) -> RateDecision:
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
        self, tenant_id: str, num_tokens: int, limits: RateLimits, *, num_requests: int = 1
    ) -> RateDecision:
        """Admit `num_requests` (1, or 0 to charge tokens only) costing num_tokens, or refuse them without
        consuming anything."""
        now = self._clock()
        window = int(now // WINDOW_SECONDS)
        with self._lock:
            start, num_counted, tokens = self._windows.get(tenant_id, (window, 0, 0))
            if start != window:
                num_counted, tokens = 0, 0
            max_requests = limits.max_requests_per_min
            if num_requests and max_requests is not None and num_counted + num_requests > max_requests:
                return _refusal("requests", max_requests, now)
            if limits.max_tokens_per_min is not None and tokens + num_tokens > limits.max_tokens_per_min:
                return _refusal("tokens", limits.max_tokens_per_min, now)
            self._windows[tenant_id] = (window, num_counted + num_requests, tokens + num_tokens)
        return RateDecision(True)

    def acquire_slot(self, tenant_id: str, request_id: str, max_concurrent_requests: int) -> RateDecision:
        """Hold one of the tenant's concurrent-request slots for request_id, or refuse taking nothing."""
        now = self._clock()
        with self._lock:
            held = self._slots.setdefault(tenant_id, {})
            for expired in [rid for rid, taken in held.items() if taken <= now - self.slot_lease_s]:
                del held[expired]
            if request_id not in held and len(held) >= max_concurrent_requests:
                return _slot_refusal(max_concurrent_requests)
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

    def num_held_slots(self, tenant_id: str) -> int:
        """The tenant's slots that count now, leases not expired (tests and stats)."""
        now = self._clock()
        with self._lock:
            return sum(taken > now - self.slot_lease_s for taken in self._slots.get(tenant_id, {}).values())


# KEYS[1] = request counter, KEYS[2] = token counter; ARGV = max_requests, max_tokens, num_tokens, ttl,
# num_requests (a negative limit means unlimited; num_requests 0 leaves the request counter alone).
# Returns 0 = allowed, 1 = requests exceeded, 2 = tokens exceeded.
_LUA_ACQUIRE = """
local r = tonumber(redis.call('GET', KEYS[1]) or '0')
local t = tonumber(redis.call('GET', KEYS[2]) or '0')
local max_r = tonumber(ARGV[1]); local max_t = tonumber(ARGV[2]); local n = tonumber(ARGV[3])
local num_r = tonumber(ARGV[5])
if num_r > 0 and max_r >= 0 and r + num_r > max_r then return 1 end
if max_t >= 0 and t + n > max_t then return 2 end
if num_r > 0 then redis.call('INCRBY', KEYS[1], num_r); redis.call('EXPIRE', KEYS[1], ARGV[4]) end
redis.call('INCRBY', KEYS[2], n); redis.call('EXPIRE', KEYS[2], ARGV[4])
return 0
"""


# KEYS[1] = the tenant's slot set (request id -> when taken); ARGV = now, lease, max, request id.
# Returns 0 = held, 1 = every slot is taken.
_LUA_ACQUIRE_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]) - tonumber(ARGV[2]))
if not redis.call('ZSCORE', KEYS[1], ARGV[4]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 1
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4]); redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])))
return 0
"""


# KEYS[i] = the slot set of the i-th renewed slot's tenant; ARGV = now, lease, then the i-th slot's request id.
# Stamps each slot still held with `now` (one expired by now stays gone: the acquire script would drop it) and
# keeps its set alive for a lease. Returns how many slots were renewed.
_LUA_RENEW_SLOTS = """
local now = tonumber(ARGV[1]); local lease = tonumber(ARGV[2]); local n = 0
for i, key in ipairs(KEYS) do
  local taken = redis.call('ZSCORE', key, ARGV[i + 2])
  if taken and tonumber(taken) > now - lease then
    redis.call('ZADD', key, 'XX', now, ARGV[i + 2]); redis.call('EXPIRE', key, math.ceil(lease)); n = n + 1
  end
end
return n
"""


class RedisRateLimiter:
    """Fixed-window counters in Redis, shared by all API replicas."""

    def __init__(
        self,
        client: Any,
        key_prefix: str = "lorahost:rl:",
        clock: Callable[[], float] = time.time,
        *,
        slot_lease_s: float = DEFAULT_SLOT_LEASE_S,
    ) -> None:
        self._client = client
        self._prefix = key_prefix
        self._clock = clock
        self.slot_lease_s = slot_lease_s
        self._script = client.register_script(_LUA_ACQUIRE)
        self._slot_script = client.register_script(_LUA_ACQUIRE_SLOT)
        self._renew_script = client.register_script(_LUA_RENEW_SLOTS)
        self._fallback = InMemoryRateLimiter(
            clock, slot_lease_s=slot_lease_s
        )  # used while Redis is unreachable
        self.is_degraded = False

    def acquire(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, *, num_requests: int = 1
    ) -> RateDecision:
        """Admit `num_requests` (1, or 0 to charge tokens only) costing num_tokens, or refuse them without
        consuming anything (counted in this process while Redis is unreachable)."""
        try:
            decision = self._acquire_in_redis(tenant_id, num_tokens, limits, num_requests)
        except RedisError as exc:
            self._on_redis_error(exc)
            return self._fallback.acquire(tenant_id, num_tokens, limits, num_requests=num_requests)
        self._on_redis_answered()
        return decision

    def acquire_slot(self, tenant_id: str, request_id: str, max_concurrent_requests: int) -> RateDecision:
        """Hold one of the tenant's concurrent-request slots for request_id in Redis (in this process while
        Redis is unreachable), or refuse taking nothing."""
        try:
            code = int(
                self._slot_script(
                    keys=[self._slot_key(tenant_id)],
                    args=[self._clock(), self.slot_lease_s, max_concurrent_requests, request_id],
                )
            )
        except RedisError as exc:
            self._on_redis_error(exc)
            return self._fallback.acquire_slot(tenant_id, request_id, max_concurrent_requests)
        self._on_redis_answered()
        return _slot_refusal(max_concurrent_requests) if code == 1 else RateDecision(True)

    def release_slot(self, tenant_id: str, request_id: str) -> None:
        """Give the request's slot back, in Redis and in the fallback (both idempotent)."""
        self._fallback.release_slot(tenant_id, request_id)
        try:
            self._client.zrem(self._slot_key(tenant_id), request_id)
        except RedisError as exc:  # the slot's lease runs out instead
            self._on_redis_error(exc)

    def renew_slots(self, slots: Iterable[tuple[str, str]]) -> int:
        """Renew the lease of each held (tenant id, request id) slot, in the fallback and in Redis with one
        script call for all (a released or expired one stays gone); returns how many were renewed. While Redis
        is unreachable only the fallback's are renewed: the ones in Redis run out, as a dead process's would."""
        slots = list(slots)
        num_renewed = self._fallback.renew_slots(slots)
        if not slots:
            return num_renewed
        try:
            num_renewed += int(
                self._renew_script(
                    keys=[self._slot_key(tenant_id) for tenant_id, _ in slots],
                    args=[self._clock(), self.slot_lease_s, *(request_id for _, request_id in slots)],
                )
            )
        except RedisError as exc:
            self._on_redis_error(exc)
            return num_renewed
        self._on_redis_answered()
        return num_renewed

    def num_held_slots(self, tenant_id: str) -> int:
        """The tenant's slots in Redis that count now, leases not expired (tests and stats)."""
        return int(
            self._client.zcount(self._slot_key(tenant_id), f"({self._clock() - self.slot_lease_s}", "+inf")
        )

    def _slot_key(self, tenant_id: str) -> str:
        return f"{self._prefix}{tenant_id}:slots"

    def _on_redis_error(self, exc: RedisError) -> None:
        if not self.is_degraded:
            log.warning("rate limits: Redis unreachable (%s); counting in this process until it answers", exc)
        self.is_degraded = True

    def _on_redis_answered(self) -> None:
        if self.is_degraded:
            log.warning("rate limits: Redis answers again; counting there")
            self.is_degraded = False

    def _acquire_in_redis(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, num_requests: int
    ) -> RateDecision:
        now = self._clock()
        window = int(now // WINDOW_SECONDS)
        keys = [f"{self._prefix}{tenant_id}:{window}:req", f"{self._prefix}{tenant_id}:{window}:tok"]
        max_r = -1 if limits.max_requests_per_min is None else limits.max_requests_per_min
        max_t = -1 if limits.max_tokens_per_min is None else limits.max_tokens_per_min
        code = int(self._script(keys=keys, args=[max_r, max_t, num_tokens, WINDOW_SECONDS * 2, num_requests]))
        if code == 1:
            return _refusal("requests", max_r, now)
        if code == 2:
            return _refusal("tokens", max_t, now)
        return RateDecision(True)
