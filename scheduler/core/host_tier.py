"""The host tier: which adapters keep their packed weights in host memory, within a byte budget.

Tiers, fastest first: device (the page pool), host memory (this), the worker's local disk cache
(gpu_workers/worker/host_cache.py), the blob store. A copy to the device reads the host tier when the adapter is
there (no file read, no validation, no packing) and fills it otherwise. Entries are keyed by the engine's
adapter id plus its file path, so a re-registered adapter (another version or other files) never reuses a
stale entry. Entries go least recently used first when a new one needs room (a copy in flight keeps its own
reference to the tensors, so evicting its entry never breaks it). An entry larger than the budget is not kept.

Pure bookkeeping (no tensors): the engine holds the tensors and drops the keys this returns.
"""

from __future__ import annotations

from scheduler.core.byte_budget_lru import ByteBudgetLRU


class HostTier:
    """LRU over host copies with a byte budget (scheduler/core/byte_budget_lru.py), counting hits and misses."""

    def __init__(self, max_bytes: int) -> None:
        self._lru = ByteBudgetLRU(max_bytes)
        self.num_hits = 0
        self.num_misses = 0

    @property
    def max_bytes(self) -> int:
        """The byte budget."""
        return self._lru.max_bytes

    @property
    def num_bytes(self) -> int:
        """Bytes of the kept host copies."""
        return self._lru.num_bytes

    def __contains__(self, key: str) -> bool:
        return key in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, key: str) -> bool:
        """True (and the entry becomes most recently used) when the key has a host copy; counts hit/miss."""
        if self._lru.touch(key):
            self.num_hits += 1
            return True
        self.num_misses += 1
        return False

    def add(self, key: str, num_bytes: int) -> list[str] | None:
        """Keep a new host copy; returns the keys evicted to make room, or None when it is larger than the
        whole budget (nothing changes; the caller drops the copy after use)."""
        if num_bytes > self._lru.max_bytes:
            return None
        self._lru.put(key, num_bytes)
        return self._lru.evict_over_budget(keep=key)

    def remove(self, key: str) -> None:
        """Forget an entry (no-op when absent)."""
        self._lru.remove(key)

    def keys(self) -> list[str]:
        """Cached keys, least recently used first."""
        return self._lru.keys()
