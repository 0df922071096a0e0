"""Adapter access statistics for the eviction policies (scheduler/cache/eviction.py): the requests for each
adapter within a sliding window, and the sequences per step over the last BATCH_SIZE_WINDOW_S (FastLibra's
recent batch size). Times are readings of the residency's clock; only their differences matter."""

from __future__ import annotations

import itertools
from collections import Counter, deque

from scheduler.cache.eviction import BATCH_SIZE_WINDOW_S, CacheView


class AdapterAccessStats:
    """Accesses per adapter within `access_window_s` and the recent batch size."""

    def __init__(self, access_window_s: float) -> None:
        self.access_window_s = access_window_s
        # Accesses within the window, oldest first, and their count per adapter.
        self._accesses: deque[tuple[float, str]] = deque()
        self.num_accesses: Counter[str] = Counter()
        # Sequences per step over the last BATCH_SIZE_WINDOW_S: (time, count), oldest first, and their sum.
        self._batch_sizes: deque[tuple[float, int]] = deque()
        self._batch_size_sum = 0

    def record_access(self, adapter_id: str, now: float) -> None:
        """A request for the adapter arrived at `now`."""
        self._accesses.append((now, adapter_id))
        self.num_accesses[adapter_id] += 1

    def num_recent_accesses(self, adapter_id: str, now: float) -> int:
        """Accesses to the adapter within the window before `now`."""
        self.forget_old_accesses(now)
        return self.num_accesses[adapter_id]

    def record_batch_sizes(self, num_seqs: int, step_starts: list[float]) -> None:
        """Steps planned at `step_starts` (ascending) each ran `num_seqs` sequences: what one record per step
        leaves (old sizes are dropped against the last start only, which drops every size an earlier start
        would have)."""
        self._batch_sizes.extend(zip(step_starts, itertools.repeat(num_seqs)))
        self._batch_size_sum += num_seqs * len(step_starts)
        now = step_starts[-1]
        while self._batch_sizes and self._batch_sizes[0][0] < now - BATCH_SIZE_WINDOW_S:
            self._batch_size_sum -= self._batch_sizes.popleft()[1]

    def forget_old_accesses(self, now: float) -> None:
        """Drop the accesses older than the window before `now`."""
        while self._accesses and self._accesses[0][0] < now - self.access_window_s:
            _, adapter_id = self._accesses.popleft()
            self.num_accesses[adapter_id] -= 1
            if not self.num_accesses[adapter_id]:
                del self.num_accesses[adapter_id]

    def cache_view(self, now: float, num_on_device: int) -> CacheView:
        """What the eviction policy sees of the whole cache at `now`, `num_on_device` adapters resident."""
        self.forget_old_accesses(now)
        num_accesses = len(self._accesses)
        shares = tuple(n / num_accesses for n in self.num_accesses.values()) if num_accesses else ()
        batch_size = self._batch_size_sum / len(self._batch_sizes) if self._batch_sizes else 1.0
        return CacheView(now, num_on_device, num_accesses, shares, batch_size)
