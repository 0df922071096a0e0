"""Short-lived in-process caches that keep the database off the inference hot path.

Both caches are per API process, hold only successful lookups and expire entries after a TTL. While the
database cannot be reached (a restart, a failover), the inference path serves an expired entry up to
settings.api.cache_stale_on_db_outage_s past its TTL instead (known keys and adapters keep working; a change
made on another replica during the outage waits for the database):

  auth cache   sha256(bearer key) -> TenantAuth (tenant id, active flag, rate limits, prefix-cache namespace), for
               settings.api.auth_cache_ttl_s. A key revoked, a tenant disabled or re-planned through THIS
               process is dropped at once; on other API replicas the change takes effect within the TTL
               (that TTL is the revocation delay across replicas).
  model cache  (tenant id, model ref) -> the resolved adapter version, for settings.api.model_cache_ttl_s.
               An adapter deleted, or whose owner tenant is disabled, through this process is dropped at
               once; a new ready version, or a change made elsewhere, is seen within the TTL. Misses (unknown / not ready) are not cached,
               so a brand-new adapter is usable as soon as it is ready.
A TTL of 0 disables a cache (every request reads the database).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from api.errors import is_database_unavailable
from api.plan_limits import SamplingLimits
from api.ratelimit import RateLimits
from cluster.protocol import AdapterRef, prefix_cache_namespace

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
DEFAULT_MAX_ENTRIES = 10_000
REFRESH_AHEAD_FRACTION = 0.25  # TtlCache.load reloads an entry used in the last quarter of its TTL


class TtlCache(Generic[K, V]):
    """A thread-safe dict whose entries expire `ttl_s` after they were put (bounded: oldest out first). An
    expired entry is kept `max_stale_s` longer for `get_stale` alone: what the inference path falls back on
    while the database cannot be reached.

    `load` is the event loop's read-through: concurrent misses of one key share one load, and a hit in the last
    REFRESH_AHEAD_FRACTION of its entry's TTL starts one reload in the background while the request goes on
    with the live value, so a key in steady use never expires and no request of it waits on the database (it
    did: each replica's auth entry expired every 5 s, and the requests arriving meanwhile each read the database
    in the threadpool, 10-30 ms at p99 under 2,000 streams; benchmarks/RESULTS.md). No value is served past its
    TTL (the revocation delay across replicas stays the TTL), and a reload never brings back an entry dropped
    meanwhile (a key revoked through this process).
    """

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
        max_stale_s: float = 0.0,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_stale_s = max_stale_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[K, tuple[float, V]] = {}
        # event loop -> key -> its load in flight (a task belongs to the loop that made it)
        self._loads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[K, asyncio.Task[V | None]]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, key: K) -> V | None:
        """The live value under key, or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        now = self._clock()
        if entry[0] <= now:
            if entry[0] + self.max_stale_s <= now:
                with self._lock:
                    if self._entries.get(key) is entry:
                        del self._entries[key]
            return None
        return entry[1]

    async def load(self, key: K, loader: Callable[[], Awaitable[V | None]]) -> V | None:
        """The live value under key, else loader's (cached unless None; its exceptions raised), loaded once for
        every concurrent caller; an entry near the end of its TTL is reloaded in the background, replaced by the
        new value (dropped when the loader now answers None or raises anything but an outage)."""
        entry = self._entries.get(key)
        now = self._clock()
        loads = self._loads.setdefault(asyncio.get_running_loop(), {})
        if entry is not None and entry[0] > now:
            if entry[0] - now < self.ttl_s * REFRESH_AHEAD_FRACTION and key not in loads:
                self._start(loads, key, self._reload(key, entry, loader))
            return entry[1]
        task = loads.get(key)
        if task is None:
            task = self._start(loads, key, self._load_missing(key, loader))
        return await asyncio.shield(task)

    def _start(
        self, loads: dict[K, asyncio.Task[V | None]], key: K, job: Coroutine[Any, Any, V | None]
    ) -> asyncio.Task[V | None]:
        task = asyncio.ensure_future(job)
        loads[key] = task
        task.add_done_callback(lambda done: loads.pop(key) if loads.get(key) is done else None)
        return task

    async def _load_missing(self, key: K, loader: Callable[[], Awaitable[V | None]]) -> V | None:
        value = await loader()
        if value is not None:
            self.put(key, value)
        return value

    async def _reload(
        self, key: K, entry: tuple[float, V], loader: Callable[[], Awaitable[V | None]]
    ) -> V | None:
        try:
            value = await loader()
        except Exception as exc:  # noqa: BLE001 - the next request's foreground load answers it
            # an outage: the entry serves on until its TTL; anything else (revoked, gone, a failure) drops it
            if not is_database_unavailable(exc):
                self._replace(key, entry, None)
            return None
        self._replace(key, entry, value)
        return value

    def _replace(self, key: K, entry: tuple[float, V], value: V | None) -> None:
        """Put value (None: drop) in place of `entry`, unless that entry was dropped or replaced meanwhile."""
        with self._lock:
            if self._entries.get(key) is not entry:
                return
            del self._entries[key]
            if value is not None and self.ttl_s > 0:
                self._entries[key] = (self._clock() + self.ttl_s, value)

    def get_stale(self, key: K) -> V | None:
        """The value under key, live or expired less than max_stale_s ago, or None (only when the source of
        truth cannot be asked)."""
        entry = self._entries.get(key)
        if entry is None or entry[0] + self.max_stale_s <= self._clock():
            return None
        return entry[1]

    def put(self, key: K, value: V) -> None:
        """Store value under key for ttl_s (a no-op when the cache is disabled)."""
        if self.ttl_s <= 0:
            return
        with self._lock:
            self._entries.pop(key, None)
            while len(self._entries) >= self.max_entries:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = (self._clock() + self.ttl_s, value)

    def discard_if(self, predicate: Callable[[K, V], bool]) -> int:
        """Drop every entry matching predicate(key, value); returns how many were dropped."""
        with self._lock:
            doomed = [k for k, (_, v) in self._entries.items() if predicate(k, v)]
            for key in doomed:
                del self._entries[key]
        return len(doomed)

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            self._entries.clear()


@dataclass(frozen=True)
class TenantAuth:
    """What the inference path needs from a verified tenant key (no ORM objects: safe to share)."""

    tenant_id: str
    key_id: str
    is_active: bool
    limits: RateLimits
    fair_share_weight: float = (
        1.0  # its plan's weight under fair share (scheduler/admission/fair_share.py); 1 when unset
    )
    shared_cache_namespace: str | None = None  # Tenant.prefix_cache_namespace (set by an operator only)
    sampling_limits: SamplingLimits = field(
        default_factory=SamplingLimits
    )  # its plan's max_n and max_top_logprobs

    @property
    def cache_namespace(self) -> str | None:
        """The engine's prefix-cache namespace for this tenant's requests: the shared one an operator put it in,
        else its own (cluster.protocol.prefix_cache_namespace)."""
        return prefix_cache_namespace(self.tenant_id, self.shared_cache_namespace)


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference resolved for one tenant: the adapter version to apply (None: the base model)."""

    base_model: str
    adapter: AdapterRef | None = None
    adapter_id: str | None = None
    adapter_version_id: str | None = None


def key_digest(presented: str) -> str:
    """The auth cache key of a bearer key (the clear key is never kept in memory)."""
    return hashlib.sha256(presented.encode()).hexdigest()


def forget_key(auth_cache: TtlCache[str, TenantAuth], key_id: str) -> None:
    """Drop a revoked key from this process's auth cache."""
    auth_cache.discard_if(lambda _, auth: auth.key_id == key_id)


def forget_tenant(auth_cache: TtlCache[str, TenantAuth], tenant_id: str) -> None:
    """Drop a changed (disabled, re-planned) tenant's keys from this process's auth cache."""
    auth_cache.discard_if(lambda _, auth: auth.tenant_id == tenant_id)


def forget_model_name(model_cache: TtlCache[tuple[str, str], ResolvedModel], name: str) -> None:
    """Drop every cached resolution of an adapter name (any tenant: public adapters are shared)."""
    model_cache.discard_if(lambda key, _: key[1].partition("@")[0] == name)


def forget_adapters(model_cache: TtlCache[tuple[str, str], ResolvedModel], adapter_ids: set[str]) -> None:
    """Drop every cached resolution to one of these adapters (e.g. all of a tenant just disabled)."""
    model_cache.discard_if(lambda _, resolved: resolved.adapter_id in adapter_ids)


def stale_on_outage(cache: TtlCache[K, V], key: K, error: Exception) -> V:
    """The stale value under key when `error` says the database cannot be reached (the lookup that raised it
    falls back on the cache); otherwise, or with nothing cached, `error` is raised again."""
    if is_database_unavailable(error):
        value = cache.get_stale(key)
        if value is not None:
            log.warning("the database is unavailable; serving a cached lookup (%s)", type(error).__name__)
            return value
    raise error
