"""A sliding-window limit on events per key (the console's sign-in attempts per client address): at most
`max_per_window` events in ANY `window_s` span, not per calendar minute. A fixed window (api/ratelimit.py's
per-tenant budgets) admits up to twice its limit around a window boundary (a full budget just before the
minute turns and another just after); a log of each key's event times does not.

Two implementations behind one interface, like api/ratelimit.py: `InMemorySlidingLimiter` (one process) and
`RedisSlidingLimiter` (every API replica shares the log: a sorted set per key, one atomic Lua script per
check). A refused event is not logged. While Redis is unreachable, `RedisSlidingLimiter` counts in process
memory instead (each replica then enforces the whole limit on its own) and returns to Redis once it answers.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from redis.exceptions import RedisError

from api.ratelimit import RateDecision

log = logging.getLogger(__name__)

DEFAULT_WINDOW_S = 60.0
# The in-memory log drops the keys with no event in the window once it holds this many keys.
MAX_IDLE_KEYS = 10_000


class SlidingWindowLimiter(Protocol):
    """Admits an event for a key when fewer than max_per_window were admitted in the last window."""

    def acquire(self, key: str, max_per_window: int) -> RateDecision:
        """Log one event for key and admit it, or refuse it logging nothing (with the seconds to wait)."""
        ...


def _refusal(max_per_window: int, window_s: float, oldest_s: float, now_s: float) -> RateDecision:
    retry = max(1, math.ceil(oldest_s + window_s - now_s))
    return RateDecision(
        False, retry, f"limit of {max_per_window} per {window_s:g} s reached; retry in {retry} s"
    )


class InMemorySlidingLimiter:
    """The event log in process memory."""

    def __init__(self, clock: Callable[[], float] = time.time, window_s: float = DEFAULT_WINDOW_S) -> None:
        self._clock = clock
        self.window_s = window_s
        self._lock = threading.Lock()
        self._events: dict[str, deque[float]] = {}  # key -> its admitted events' times, oldest first

    def acquire(self, key: str, max_per_window: int) -> RateDecision:
        """Log one event for key and admit it, or refuse it logging nothing."""
        now = self._clock()
        with self._lock:
            if len(self._events) > MAX_IDLE_KEYS:
                self._forget_idle_keys(now)
            events = self._events.setdefault(key, deque())
            while events and events[0] <= now - self.window_s:
                events.popleft()
            if len(events) >= max_per_window:
                return _refusal(max_per_window, self.window_s, events[0] if events else now, now)
            events.append(now)
        return RateDecision(True)

    def _forget_idle_keys(self, now: float) -> None:
        for key in [
            k for k, events in self._events.items() if not events or events[-1] <= now - self.window_s
        ]:
            del self._events[key]


# KEYS[1] = the key's log (member -> event time); ARGV = now, window, max, a unique member.
# Returns nil when the event is admitted, else the oldest logged event's time (a string).
_LUA_ACQUIRE = """
local now = tonumber(ARGV[1]); local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
end
redis.call('ZADD', KEYS[1], now, ARGV[4]); redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
return false
"""


class RedisSlidingLimiter:
    """The event log in Redis, shared by all API replicas."""

    def __init__(
        self,
        client: Any,
        key_prefix: str = "lorahost:sl:",
        clock: Callable[[], float] = time.time,
        window_s: float = DEFAULT_WINDOW_S,
    ) -> None:
        self._client = client
        self._prefix = key_prefix
        self._clock = clock
        self.window_s = window_s
        self._script = client.register_script(_LUA_ACQUIRE)
        self._fallback = InMemorySlidingLimiter(clock, window_s)  # used while Redis is unreachable
        self.is_degraded = False

    def acquire(self, key: str, max_per_window: int) -> RateDecision:
        """Log one event for key and admit it, or refuse it logging nothing (in this process while Redis is
        unreachable)."""
        now = self._clock()
        try:
            oldest = self._script(
                keys=[f"{self._prefix}{key}"],
                args=[now, self.window_s, max_per_window, f"{now}:{uuid.uuid4().hex}"],
            )
        except RedisError as exc:
            if not self.is_degraded:
                log.warning(
                    "sliding limits: Redis unreachable (%s); counting in this process until it answers", exc
                )
            self.is_degraded = True
            return self._fallback.acquire(key, max_per_window)
        if self.is_degraded:
            log.warning("sliding limits: Redis answers again; counting there")
            self.is_degraded = False
        if oldest is None:
            return RateDecision(True)
        return _refusal(max_per_window, self.window_s, float(oldest), now)
