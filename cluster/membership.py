"""Worker membership: workers register and heartbeat; the API lists the live ones for routing.

`InMemoryWorkerDirectory` serves embedded mode (one process); `RedisWorkerDirectory` serves a cluster:
each worker's record is a Redis key with a TTL, so a worker that stops heartbeating disappears on its own.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from cluster.protocol import WorkerStats


class WorkerRecord(WorkerStats):
    """A worker's advertised state (refreshed on every heartbeat): its WorkerStats plus the URL it is reached at.

    Built on the worker with `from_stats`. Stored as flat JSON (WorkerStats' fields and `url`); `from_json`
    drops keys it does not know (a newer worker's fields) and reads the counters an older worker kept in
    an `extra` dict. `WorkerRecord(worker_id, url, base_model, **stats)` builds one directly.
    """

    url: str

    def __init__(self, worker_id: str, url: str, base_model: str, **stats: Any) -> None:
        super().__init__(**{"worker_id": worker_id, "url": url, "base_model": base_model, **stats})

    @classmethod
    def from_stats(cls, stats: WorkerStats, url: str) -> WorkerRecord:
        """The heartbeat record of a worker reached at `url` whose state is `stats`."""
        return cls.model_validate({**stats.model_dump(), "url": url})

    def to_json(self) -> str:
        """Serialise for storage."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerRecord:
        """Parse a stored record (the keys this build does not know, a newer worker's fields, are dropped
        here, the one place that drops any; a legacy `extra` dict fills the counters; a null list is empty)."""
        data: dict[str, Any] = json.loads(raw)
        legacy = data.pop("extra", None)
        if isinstance(legacy, dict):
            data = {**legacy, **data}
        return cls.model_validate(
            {
                k: v
                for k, v in data.items()
                if k in cls.model_fields and not (v is None and k in _SEQUENCE_FIELDS)
            }
        )


_SEQUENCE_FIELDS = frozenset(
    name for name, f in WorkerRecord.model_fields.items() if isinstance(f.default, tuple) or f.default_factory
)


class WorkerDirectory(Protocol):
    """Where workers announce themselves."""

    def heartbeat(self, record: WorkerRecord, ttl_s: float) -> None:
        """Register or refresh a worker; it expires ttl_s after its last heartbeat."""
        ...

    def remove(self, worker_id: str) -> None:
        """Deregister a worker now (graceful shutdown)."""
        ...

    def list_live(self) -> list[WorkerRecord]:
        """Workers whose last heartbeat has not expired, sorted by id."""
        ...


class InMemoryWorkerDirectory:
    """Process-local directory for embedded mode."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[str, tuple[WorkerRecord, float]] = {}

    def heartbeat(self, record: WorkerRecord, ttl_s: float) -> None:
        """Register or refresh a worker; it expires ttl_s after its last heartbeat."""
        with self._lock:
            self._records[record.worker_id] = (record, self._clock() + ttl_s)

    def remove(self, worker_id: str) -> None:
        """Deregister a worker now."""
        with self._lock:
            self._records.pop(worker_id, None)

    def list_live(self) -> list[WorkerRecord]:
        """Workers whose last heartbeat has not expired, sorted by id."""
        now = self._clock()
        with self._lock:
            return sorted((r for r, exp in self._records.values() if exp > now), key=lambda r: r.worker_id)


class RedisWorkerDirectory:
    """Redis-backed directory: one key per worker with a TTL, plus an index set of ids."""

    def __init__(self, client: Any, key_prefix: str = "lorahost:workers:") -> None:
        self._client = client
        self._prefix = key_prefix

    def heartbeat(self, record: WorkerRecord, ttl_s: float) -> None:
        """Register or refresh a worker; it expires ttl_s after its last heartbeat."""
        pipe = self._client.pipeline()
        pipe.set(self._prefix + record.worker_id, record.to_json(), px=max(1, int(ttl_s * 1000)))
        pipe.sadd(self._prefix + "index", record.worker_id)
        pipe.execute()

    def remove(self, worker_id: str) -> None:
        """Deregister a worker now."""
        pipe = self._client.pipeline()
        pipe.delete(self._prefix + worker_id)
        pipe.srem(self._prefix + "index", worker_id)
        pipe.execute()

    def list_live(self) -> list[WorkerRecord]:
        """Workers whose key has not expired (stale index entries are pruned)."""
        ids = sorted(
            i.decode() if isinstance(i, bytes) else i for i in self._client.smembers(self._prefix + "index")
        )
        if not ids:
            return []
        raws = self._client.mget([self._prefix + i for i in ids])
        live, stale = [], []
        for worker_id, raw in zip(ids, raws):
            (live.append(WorkerRecord.from_json(raw)) if raw is not None else stale.append(worker_id))
        if stale:
            self._client.srem(self._prefix + "index", *stale)
        return live
