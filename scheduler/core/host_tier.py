"""The host tier: which adapters keep their packed weights in host memory, within a byte budget.

Tiers, fastest first: device (the page pool), host memory (this), the worker's local disk cache
(gpu_workers/host_cache.py), the blob store. A copy to the device reads the host tier when the adapter is
there (no file read, no validation, no packing) and fills it otherwise. Entries are keyed by the engine's
adapter id plus its file path, so a re-registered adapter (another version or other files) never reuses a
stale entry. Entries go least recently used first when a new one needs room (a copy in flight keeps its own
reference to the tensors, so evicting its entry never breaks it). An entry larger than the budget is not kept.

Pure bookkeeping (no tensors): the engine holds the tensors and drops the keys this returns.
"""

from __future__ import annotations

from collections import OrderedDict


class HostTier:
    """LRU over host copies with a byte budget."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, int] = OrderedDict()  # key -> bytes, least recently used first
        self.num_bytes = 0
        self.num_hits = 0
        self.num_misses = 0

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: str) -> bool:
        """True (and the entry becomes most recently used) when the key has a host copy; counts hit/miss."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self.num_hits += 1
            return True
        self.num_misses += 1
        return False

    def add(self, key: str, num_bytes: int) -> list[str] | None:
        """Keep a new host copy; returns the keys evicted to make room, or None when it is larger than the
        whole budget (nothing changes; the caller drops the copy after use)."""
        if num_bytes > self.max_bytes:
            return None
        self.remove(key)
        victims: list[str] = []
        num_free = self.max_bytes - self.num_bytes
        for candidate, size in self._entries.items():
            if num_free >= num_bytes:
                break
            victims.append(candidate)
            num_free += size
        for victim in victims:
            self.remove(victim)
        self._entries[key] = num_bytes
        self.num_bytes += num_bytes
        return victims

    def remove(self, key: str) -> None:
        """Forget an entry (no-op when absent)."""
        size = self._entries.pop(key, None)
        if size is not None:
            self.num_bytes -= size

    def keys(self) -> list[str]:
        """Cached keys, least recently used first."""
        return list(self._entries)
