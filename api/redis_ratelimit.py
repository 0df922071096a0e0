"""The Redis rate limiter (api/ratelimit.py states the rules): fixed-window counters and concurrent-request slots
shared by every API replica, each check one atomic Lua script, counted in process memory while Redis is
unreachable.

The blocking methods serve the callers that run in threads (uploads, keys, the usage writer's slot renewals); the
inference path's `acquire_async`, `acquire_slot_async` and `release_slot_async` run the same scripts on a
connection of the calling event loop, so a request's checks neither block the loop nor wait for a thread: one
pipelined connection per loop, with a bounded number of commands in flight (`async_redis_client`,
api/redis_pipeline.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio.to_thread
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from api.ratelimit import (
    DEFAULT_SLOT_LEASE_S,
    WINDOW_SECONDS,
    InMemoryRateLimiter,
    RateDecision,
    RateLimits,
    refusal,
    slot_refusal,
)
from api.redis_pipeline import DEFAULT_TIMEOUT_S, PipelinedRedis

log = logging.getLogger(__name__)

# KEYS[1] = request counter, KEYS[2] = token counter; ARGV = max_requests, max_tokens, num_tokens, ttl,
# num_requests, is_request_kept (a negative limit means unlimited; num_requests 0 leaves the request counter
# alone; is_request_kept 1: a refusal by tokens still charges the requests). Returns 0 = allowed,
# 1 = requests exceeded, 2 = tokens exceeded.
_LUA_ACQUIRE = """
local r = tonumber(redis.call('GET', KEYS[1]) or '0')
local t = tonumber(redis.call('GET', KEYS[2]) or '0')
local max_r = tonumber(ARGV[1]); local max_t = tonumber(ARGV[2]); local n = tonumber(ARGV[3])
local num_r = tonumber(ARGV[5])
if num_r > 0 and max_r >= 0 and r + num_r > max_r then return 1 end
if num_r > 0 and (ARGV[6] == '1' or max_t < 0 or t + n <= max_t) then
  redis.call('INCRBY', KEYS[1], num_r); redis.call('EXPIRE', KEYS[1], ARGV[4])
end
if max_t >= 0 and t + n > max_t then return 2 end
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


REDIS_CONNECTION_WAIT_S = (
    DEFAULT_TIMEOUT_S  # a check waits this long for a turn, or for its answer, then counts in the process
)
POOL_WAIT_LOG_INTERVAL_S = 60.0  # checks that waited too long for a turn are logged at most this often
MAX_SPENT_TENANTS = 10_000  # known_refusal's memory: past windows' entries are dropped beyond this many


def async_redis_client(
    url: str, max_connections: int, client_name: str | None = None, wait_s: float = REDIS_CONNECTION_WAIT_S
) -> PipelinedRedis:
    """The Redis client of one event loop's checks: one pipelined connection (api/redis_pipeline.py) with at most
    `max_connections` commands in flight; one beyond waits for a turn up to `wait_s` (then redis ConnectionError
    "No connection available", which the limiter counts in the process without calling Redis down). A command
    Redis leaves unanswered for REDIS_CONNECTION_WAIT_S fails (counted as an outage)."""
    return PipelinedRedis(url, max_in_flight=max_connections, turn_wait_s=wait_s, client_name=client_name)


class RedisRateLimiter:
    """Fixed-window counters in Redis, shared by all API replicas. `client` is a redis.Redis (the blocking
    methods); `async_client_factory` makes an async client for the same server (`async_redis_client`, or a
    redis.asyncio.Redis), one per event loop that calls the async methods (None: those run the blocking ones in a worker thread)."""

    def __init__(
        self,
        client: Any,
        key_prefix: str = "lorahost:rl:",
        clock: Callable[[], float] = time.time,
        *,
        slot_lease_s: float = DEFAULT_SLOT_LEASE_S,
        async_client_factory: Callable[[], Any] | None = None,
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
        self.num_pool_waits = 0  # async checks that waited past their limit for a turn
        self._pool_wait_logged_at = -POOL_WAIT_LOG_INTERVAL_S
        self._async_factory = async_client_factory
        # tenant -> (window, limit) of its last refusal by the requests budget: a request in that window under a
        # limit no higher is refused without a round trip (the window's count only grows)
        self._spent: dict[str, tuple[int, int]] = {}
        # event loop -> its client and scripts: an asyncio connection belongs to the loop that opened it
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncScripts] = (
            weakref.WeakKeyDictionary()
        )

    def acquire(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, *, num_requests: int = 1
    ) -> RateDecision:
        """Admit `num_requests` (1, or 0 to charge tokens only) costing num_tokens, or refuse them without
        consuming anything (counted in this process while Redis is unreachable)."""
        return self._acquire(tenant_id, num_tokens, limits, num_requests, False)

    def _acquire(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, num_requests: int, is_request_kept: bool
    ) -> RateDecision:
        try:
            decision = self._acquire_in_redis(tenant_id, num_tokens, limits, num_requests, is_request_kept)
        except RedisError as exc:
            self._on_redis_error(exc)
            return self._fallback.acquire(
                tenant_id, num_tokens, limits, num_requests=num_requests, is_request_kept=is_request_kept
            )
        self._on_redis_answered()
        return decision

    def acquire_slot(self, tenant_id: str, request_id: str, max_concurrent_requests: int) -> RateDecision:
        """Hold one of the tenant's concurrent-request slots for request_id in Redis (in this process while
        Redis is unreachable), or refuse taking nothing."""
        try:
            code = int(self._slot_script(**self._slot_call(tenant_id, request_id, max_concurrent_requests)))
        except RedisError as exc:
            self._on_redis_error(exc)
            return self._fallback.acquire_slot(tenant_id, request_id, max_concurrent_requests)
        self._on_redis_answered()
        return slot_refusal(max_concurrent_requests) if code == 1 else RateDecision(True)

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

    def _slot_call(
        self, tenant_id: str, request_id: str, max_concurrent_requests: int
    ) -> dict[str, list[Any]]:
        """The acquire-slot script's keys and arguments."""
        return {
            "keys": [self._slot_key(tenant_id)],
            "args": [self._clock(), self.slot_lease_s, max_concurrent_requests, request_id],
        }

    def _slot_key(self, tenant_id: str) -> str:
        return f"{self._prefix}{tenant_id}:slots"

    def _on_redis_error(self, exc: RedisError) -> None:
        if is_pool_wait(exc):  # a burst, not an outage: Redis answers the checks in flight
            self._on_pool_wait()
            return
        if not self.is_degraded:
            log.warning("rate limits: Redis unreachable (%s); counting in this process until it answers", exc)
        self.is_degraded = True

    def _on_pool_wait(self) -> None:
        self.num_pool_waits += 1
        now = time.monotonic()
        if now - self._pool_wait_logged_at >= POOL_WAIT_LOG_INTERVAL_S:
            self._pool_wait_logged_at = now
            log.warning(
                "rate limits: %d checks so far waited past their limit for a turn among this process's Redis"
                " commands in flight and were counted in this process (raise LORAHOST_REDIS_MAX_CONNECTIONS if"
                " this repeats)",
                self.num_pool_waits,
            )

    def _on_redis_answered(self) -> None:
        if self.is_degraded:
            log.warning("rate limits: Redis answers again; counting there")
            self.is_degraded = False

    async def acquire_async(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, *, num_requests: int = 1
    ) -> RateDecision:
        """`acquire` on the running loop's own Redis connection: no thread hop, whose wait for the interpreter
        lock cost a request 10-20 ms at p99 under 2,000 streams (benchmarks/RESULTS.md)."""
        return await self._acquire_async(tenant_id, num_tokens, limits, num_requests, is_request_kept=False)

    async def admit_async(self, tenant_id: str, num_tokens: int, limits: RateLimits) -> RateDecision:
        """One request and its tokens in one script call (RateLimiter.admit_async), on the loop's connection."""
        return await self._acquire_async(tenant_id, num_tokens, limits, 1, is_request_kept=True)

    def known_refusal(self, tenant_id: str, max_requests_per_min: int | None) -> RateDecision | None:
        """The requests budget's refusal this process saw in the current window under a limit no higher (from
        the in-process counters while Redis is unreachable), else None."""
        if max_requests_per_min is None:
            return None
        if self.is_degraded:
            return self._fallback.known_refusal(tenant_id, max_requests_per_min)
        now = self._clock()
        spent = self._spent.get(tenant_id)
        if spent is not None and spent[0] == int(now // WINDOW_SECONDS) and max_requests_per_min <= spent[1]:
            return refusal("requests", max_requests_per_min, now)
        return None

    async def _acquire_async(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, num_requests: int, *, is_request_kept: bool
    ) -> RateDecision:
        scripts = self._async_scripts()
        if scripts is None:
            return await anyio.to_thread.run_sync(
                partial(self._acquire, tenant_id, num_tokens, limits, num_requests, is_request_kept)
            )
        now = self._clock()
        keys, args = self._acquire_call(tenant_id, num_tokens, limits, num_requests, now, is_request_kept)
        try:
            code = int(await scripts.acquire(keys=keys, args=args))
        except RedisError as exc:
            self._on_redis_error(exc)
            return self._fallback.acquire(
                tenant_id, num_tokens, limits, num_requests=num_requests, is_request_kept=is_request_kept
            )
        self._on_redis_answered()
        return self._decision(tenant_id, code, limits, now)

    async def acquire_slot_async(
        self, tenant_id: str, request_id: str, max_concurrent_requests: int
    ) -> RateDecision:
        """`acquire_slot` on the running loop's own Redis connection (no thread hop)."""
        scripts = self._async_scripts()
        if scripts is None:
            return await anyio.to_thread.run_sync(
                self.acquire_slot, tenant_id, request_id, max_concurrent_requests
            )
        try:
            code = int(
                await scripts.acquire_slot(**self._slot_call(tenant_id, request_id, max_concurrent_requests))
            )
        except RedisError as exc:
            self._on_redis_error(exc)
            return self._fallback.acquire_slot(tenant_id, request_id, max_concurrent_requests)
        self._on_redis_answered()
        return slot_refusal(max_concurrent_requests) if code == 1 else RateDecision(True)

    async def release_slot_async(self, tenant_id: str, request_id: str) -> None:
        """`release_slot` on the running loop's own Redis connection (no thread hop)."""
        scripts = self._async_scripts()
        if scripts is None:
            await anyio.to_thread.run_sync(self.release_slot, tenant_id, request_id)
            return
        self._fallback.release_slot(tenant_id, request_id)
        try:
            await scripts.client.zrem(self._slot_key(tenant_id), request_id)
        except RedisError as exc:  # the slot's lease runs out instead
            self._on_redis_error(exc)

    async def aclose(self) -> None:
        """Close the running loop's Redis connections (a later async call opens new ones)."""
        scripts = self._async.pop(asyncio.get_running_loop(), None)
        if scripts is not None:
            await scripts.client.aclose()

    def _async_scripts(self) -> _AsyncScripts | None:
        if self._async_factory is None:
            return None
        loop = asyncio.get_running_loop()
        scripts = self._async.get(loop)
        if scripts is None:
            client = self._async_factory()
            scripts = _AsyncScripts(
                client, client.register_script(_LUA_ACQUIRE), client.register_script(_LUA_ACQUIRE_SLOT)
            )
            self._async[loop] = scripts
        return scripts

    def _acquire_in_redis(
        self, tenant_id: str, num_tokens: int, limits: RateLimits, num_requests: int, is_request_kept: bool
    ) -> RateDecision:
        now = self._clock()
        keys, args = self._acquire_call(tenant_id, num_tokens, limits, num_requests, now, is_request_kept)
        return self._decision(tenant_id, int(self._script(keys=keys, args=args)), limits, now)

    def _acquire_call(
        self,
        tenant_id: str,
        num_tokens: int,
        limits: RateLimits,
        num_requests: int,
        now: float,
        is_request_kept: bool,
    ) -> tuple[list[str], list[int]]:
        """The acquire script's keys and arguments."""
        window = int(now // WINDOW_SECONDS)
        keys = [f"{self._prefix}{tenant_id}:{window}:req", f"{self._prefix}{tenant_id}:{window}:tok"]
        max_r = -1 if limits.max_requests_per_min is None else limits.max_requests_per_min
        max_t = -1 if limits.max_tokens_per_min is None else limits.max_tokens_per_min
        return keys, [max_r, max_t, num_tokens, WINDOW_SECONDS * 2, num_requests, int(is_request_kept)]

    def _decision(self, tenant_id: str, code: int, limits: RateLimits, now: float) -> RateDecision:
        """The acquire script's answer (0 allowed, 1 requests exceeded, 2 tokens exceeded), a refusal by the
        requests budget remembered for known_refusal."""
        if code == 1:
            limit = limits.max_requests_per_min or 0
            window = int(now // WINDOW_SECONDS)
            if len(self._spent) >= MAX_SPENT_TENANTS:  # drop the past windows' entries
                self._spent = {t: spent for t, spent in self._spent.items() if spent[0] == window}
            self._spent[tenant_id] = (window, limit)
            return refusal("requests", limit, now)
        if code == 2:
            return refusal("tokens", limits.max_tokens_per_min or 0, now)
        return RateDecision(True)


@dataclass(frozen=True)
class _AsyncScripts:
    """One event loop's Redis client and its registered scripts."""

    client: Any
    acquire: Any
    acquire_slot: Any


def is_pool_wait(exc: BaseException) -> bool:
    """Whether a redis error is a bounded client's "No connection available": the wait for a turn among the
    commands in flight ran out (a ConnectionError from a TimeoutError), while Redis itself may be answering."""
    return isinstance(exc, RedisConnectionError) and isinstance(exc.__cause__, TimeoutError)
