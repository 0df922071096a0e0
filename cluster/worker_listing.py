"""The API's cached view of the live workers: one directory read per `ttl_s`, not one per request.

`CachedWorkerListing.list_live(directory)` returns the directory's live records, read at most once per
`ttl_s` (settings.routing.worker_view_cache_s, well under the heartbeat TTL: a worker that stops heartbeating leaves
the view at most `ttl_s` after its record expires). When the directory raises (Redis briefly unavailable),
routing goes on from the last listing read, however old, and the outage is logged once (its end too); the
directory is retried once per `ttl_s` meanwhile. With no listing yet, the view is empty (requests wait as in
a cold start). `fresh(directory)` answers from the
cache without I/O (None when a read is due), so the request path can skip the thread hop on a hit.
A different directory object (tests, a re-published one) starts a new cache.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cluster.membership import WorkerDirectory, WorkerRecord

logger = logging.getLogger("lorahost.cluster")


class CachedWorkerListing:
    """A directory's `list_live`, cached for `ttl_s` seconds, falling back to the last listing on errors."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s < 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._directory: WorkerDirectory | None = None
        self._records: list[WorkerRecord] | None = None
        self._checked_at = float("-inf")  # the last read attempt (failed ones too: retried once per ttl_s)
        self.is_stale = False  # True while the directory fails and the last listing is served

    def fresh(self, directory: WorkerDirectory) -> list[WorkerRecord] | None:
        """The cached listing when it is younger than ttl_s and from `directory`, else None (no I/O)."""
        with self._lock:
            if directory is not self._directory or self._records is None:
                return None
            if self._clock() - self._checked_at >= self.ttl_s:
                return None
            return self._records

    def list_live(self, directory: WorkerDirectory) -> list[WorkerRecord]:
        """The live records: cached, read from `directory` when due, the last listing if the read fails."""
        cached = self.fresh(directory)
        if cached is not None:
            return cached
        try:
            records = directory.list_live()
        except Exception as exc:  # noqa: BLE001 (any directory failure: keep routing from the last view)
            return self._fallback(directory, exc)
        with self._lock:
            if self.is_stale:
                logger.warning("worker directory is readable again; routing from live records")
            self._directory, self._records, self._checked_at = directory, records, self._clock()
            self.is_stale = False
        return records

    def _fallback(self, directory: WorkerDirectory, exc: Exception) -> list[WorkerRecord]:
        with self._lock:
            has_view = directory is self._directory and self._records is not None
            if not self.is_stale:
                logger.warning(
                    "worker directory unreadable (%s: %s); routing from the last listing of %d workers until it "
                    "recovers",
                    type(exc).__name__,
                    exc,
                    len(self._records or []) if has_view else 0,
                )
            self.is_stale = True
            self._checked_at = self._clock()
            if not has_view:
                self._directory, self._records = directory, []
            return list(self._records or [])
