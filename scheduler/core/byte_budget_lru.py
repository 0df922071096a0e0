"""A byte-budget LRU of keys: sizes, recency order and pins; the caller holds the values.

Shared by the host tier of packed adapter copies (scheduler/core/host_tier.py) and the worker's disk cache
of adapter files (gpu_workers/worker/host_cache.py). Plain bookkeeping (no values, no I/O, no locking): the
caller drops what `evict_over_budget` returns.

Invariants: `num_bytes` is the sum of the entries' sizes; `evict_over_budget` removes entries least
recently used first, never a pinned one nor the one kept, and stops as soon as `num_bytes <= max_bytes`
(it can stay over budget only while pinned or kept entries alone exceed it). Pins are counted per key and
may be taken before the key has an entry.
"""

from __future__ import annotations

from collections import OrderedDict


class ByteBudgetLRU:
    """Keys with sizes in least-recently-used order, evicted down to a byte budget (pinned keys stay)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._sizes: OrderedDict[str, int] = OrderedDict()  # key -> bytes, least recently used first
        self._pins: dict[str, int] = {}  # key -> number of pins (> 0)
        self.num_bytes = 0

    def __contains__(self, key: str) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def keys(self) -> list[str]:
        """Keys, least recently used first."""
        return list(self._sizes)

    def touch(self, key: str) -> bool:
        """Make an entry the most recently used; False when absent."""
        if key not in self._sizes:
            return False
        self._sizes.move_to_end(key)
        return True

    def put(self, key: str, num_bytes: int) -> None:
        """Add (or replace) an entry as the most recently used; evicts nothing (see `evict_over_budget`)."""
        self.remove(key)
        self._sizes[key] = num_bytes
        self.num_bytes += num_bytes

    def remove(self, key: str) -> None:
        """Forget an entry (no-op when absent); its pins stay."""
        size = self._sizes.pop(key, None)
        if size is not None:
            self.num_bytes -= size

    def pin(self, key: str) -> None:
        """Keep a key from eviction until a matching `unpin`."""
        self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key: str) -> None:
        """Release one pin (no-op when the key has none)."""
        count = self._pins.get(key, 0) - 1
        if count > 0:
            self._pins[key] = count
        else:
            self._pins.pop(key, None)

    def is_pinned(self, key: str) -> bool:
        """True while the key holds a pin."""
        return key in self._pins

    def evict_over_budget(self, keep: str | None = None) -> list[str]:
        """Remove unpinned entries other than `keep`, least recently used first, until the budget holds;
        returns the removed keys in eviction order."""
        victims: list[str] = []
        for key in list(self._sizes):
            if self.num_bytes <= self.max_bytes:
                break
            if key == keep or key in self._pins:
                continue
            self.remove(key)
            victims.append(key)
        return victims
