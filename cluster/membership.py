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

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from cluster.protocol import EngineSummary, WorkerStats
from scheduler.core.scheduler_stats import SchedulerStats


class WorkerRecord(WorkerStats):
    """A worker's advertised state (refreshed on every heartbeat): its WorkerStats plus the URL it is reached at.

    Built on the worker with `from_stats`. Stored as JSON of the same nested shape (WorkerStats' fields, its
    `scheduler` and `engine` parts, and `url`); `from_json` drops keys it does not know at any level (a newer
    worker's fields), nests the flat record an older worker wrote (before WorkerStats had parts) and reads
    the counters a still older one kept in an `extra` dict. `WorkerRecord(worker_id, url, base_model,
    **stats)` builds one directly (`scheduler=SchedulerStats(...)`, `engine=EngineSummary(...)`).
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
        here, the one place that drops any; an older worker's flat record is nested and its legacy `extra`
        dict fills the counters; a null list is empty)."""
        data: dict[str, Any] = json.loads(raw)
        legacy = data.pop("extra", None)
        if isinstance(legacy, dict):
            data = {**legacy, **data}
        return cls.model_validate(_known_fields(cls, _nest_flat_record(data)))


def _nest_flat_record(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the engine parts' fields an older worker wrote at the top level moved into `scheduler` and
    `engine` (its engine name, a string under `engine`, becomes `engine.backend`); a nested record is
    returned unchanged."""
    if isinstance(data.get("scheduler"), dict) or isinstance(data.get("engine"), dict):
        return data
    own: dict[str, Any] = {}
    core: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    for key, value in data.items():
        if key == "engine":
            engine["backend"] = value
        elif key in SchedulerStats.model_fields:
            core[key] = value
        elif key in EngineSummary.model_fields:
            engine[key] = value
        else:
            own[key] = value  # the worker's own fields (and unknown keys, which _known_fields drops)
    return {**own, "scheduler": core, "engine": engine}


def _known_fields(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """`data` without the keys `model` does not declare, in its nested parts too; a null list or mapping is
    dropped (it takes its default, empty)."""
    known: dict[str, Any] = {}
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None or (value is None and _is_collection(field)):
            continue
        part = field.annotation
        if isinstance(value, dict) and isinstance(part, type) and issubclass(part, BaseModel):
            value = _known_fields(part, value)
        known[key] = value
    return known


def _is_collection(field: FieldInfo) -> bool:
    return isinstance(field.default, tuple) or field.default_factory is not None


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
