"""Per-tenant rate limits (requests/min and tokens/min) over a fixed one-minute window.

Two implementations behind one interface: `InMemoryRateLimiter` (embedded mode, one process) and
`RedisRateLimiter` (distributed: every API replica shares the counters; one atomic Lua script per check).
A request is admitted only if BOTH budgets have room; a refused request consumes nothing.
While Redis is unreachable, `RedisRateLimiter` counts in process memory instead (each replica then enforces
the whole budget on its own, so the cluster admits up to one budget per replica) rather than failing the
request: a brief Redis outage must not stop inference (issue 12). It returns to Redis once Redis answers.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from redis.exceptions import RedisError

log = logging.getLogger(__name__)

WINDOW_SECONDS = 60


@dataclass(frozen=True)
class RateLimits:
    """A tenant's budgets per minute; None means unlimited."""

    max_requests_per_min: int | None = None
    max_tokens_per_min: int | None = None


@dataclass(frozen=True)
class RateDecision:
    """The outcome of one check."""

    is_allowed: bool
    retry_after_s: int = 0
    reason: str = ""


class RateLimiter(Protocol):
    """Checks and consumes a tenant's per-minute budgets atomically."""

    def acquire(self, tenant_id: str, num_tokens: int, limits: RateLimits) -> RateDecision:
        """Admit one request costing num_tokens, or refuse it without consuming anything."""
        ...


def _refusal(kind: str, limit: int, now: float) -> RateDecision:
    retry = max(1, math.ceil(WINDOW_SECONDS - (now % WINDOW_SECONDS)))
    return RateDecision(False, retry, f"rate limit of {limit} {kind} per minute exceeded; retry in {retry} s")


class InMemoryRateLimiter:
    """Fixed-window counters in process memory (embedded mode)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[int, int, int]] = {}  # tenant -> (window, requests, tokens)

    def acquire(self, tenant_id: str, num_tokens: int, limits: RateLimits) -> RateDecision:
        """Admit one request costing num_tokens, or refuse it without consuming anything."""
        now = self._clock()
        window = int(now // WINDOW_SECONDS)
        with self._lock:
            start, num_requests, tokens = self._windows.get(tenant_id, (window, 0, 0))
            if start != window:
                num_requests, tokens = 0, 0
            if limits.max_requests_per_min is not None and num_requests + 1 > limits.max_requests_per_min:
                return _refusal("requests", limits.max_requests_per_min, now)
            if limits.max_tokens_per_min is not None and tokens + num_tokens > limits.max_tokens_per_min:
                return _refusal("tokens", limits.max_tokens_per_min, now)
            self._windows[tenant_id] = (window, num_requests + 1, tokens + num_tokens)
        return RateDecision(True)


# KEYS[1] = request counter, KEYS[2] = token counter; ARGV = max_requests, max_tokens, num_tokens, ttl
# (a negative limit means unlimited). Returns 0 = allowed, 1 = requests exceeded, 2 = tokens exceeded.
_LUA_ACQUIRE = """
local r = tonumber(redis.call('GET', KEYS[1]) or '0')
local t = tonumber(redis.call('GET', KEYS[2]) or '0')
local max_r = tonumber(ARGV[1]); local max_t = tonumber(ARGV[2]); local n = tonumber(ARGV[3])
if max_r >= 0 and r + 1 > max_r then return 1 end
if max_t >= 0 and t + n > max_t then return 2 end
redis.call('INCR', KEYS[1]); redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('INCRBY', KEYS[2], n); redis.call('EXPIRE', KEYS[2], ARGV[4])
return 0
"""


class RedisRateLimiter:
    """Fixed-window counters in Redis, shared by all API replicas."""

    def __init__(self, client: Any, key_prefix: str = "lorahost:rl:", clock: Callable[[], float] = time.time):
        self._client = client
        self._prefix = key_prefix
        self._clock = clock
        self._script = client.register_script(_LUA_ACQUIRE)
        self._fallback = InMemoryRateLimiter(clock)  # used while Redis is unreachable
        self.is_degraded = False

    def acquire(self, tenant_id: str, num_tokens: int, limits: RateLimits) -> RateDecision:
        """Admit one request costing num_tokens, or refuse it without consuming anything (counted in this
        process while Redis is unreachable)."""
        try:
            decision = self._acquire_in_redis(tenant_id, num_tokens, limits)
        except RedisError as exc:
            if not self.is_degraded:
                log.warning("rate limits: Redis unreachable (%s); counting in this process until it answers", exc)
            self.is_degraded = True
            return self._fallback.acquire(tenant_id, num_tokens, limits)
        if self.is_degraded:
            log.warning("rate limits: Redis answers again; counting there")
            self.is_degraded = False
        return decision

    def _acquire_in_redis(self, tenant_id: str, num_tokens: int, limits: RateLimits) -> RateDecision:
        now = self._clock()
        window = int(now // WINDOW_SECONDS)
        keys = [f"{self._prefix}{tenant_id}:{window}:req", f"{self._prefix}{tenant_id}:{window}:tok"]
        max_r = -1 if limits.max_requests_per_min is None else limits.max_requests_per_min
        max_t = -1 if limits.max_tokens_per_min is None else limits.max_tokens_per_min
        code = int(self._script(keys=keys, args=[max_r, max_t, num_tokens, WINDOW_SECONDS * 2]))
        if code == 1:
            return _refusal("requests", max_r, now)
        if code == 2:
            return _refusal("tokens", max_t, now)
        return RateDecision(True)
