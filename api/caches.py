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

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from api.errors import is_database_unavailable
from api.plan_limits import SamplingLimits
from api.ratelimit import RateLimits
from cluster.protocol import AdapterRef, prefix_cache_namespace

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
DEFAULT_MAX_ENTRIES = 10_000


class TtlCache(Generic[K, V]):
    """A thread-safe dict whose entries expire `ttl_s` after they were put (bounded: oldest out first). An
    expired entry is kept `max_stale_s` longer for `get_stale` alone: what the inference path falls back on
    while the database cannot be reached."""

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
