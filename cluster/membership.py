"""Worker membership: workers register and heartbeat; the API lists the live ones for routing.

`InMemoryWorkerDirectory` serves embedded mode (one process); `RedisWorkerDirectory` serves a cluster:
each worker's record is a Redis key with a TTL, so a worker that stops heartbeating disappears on its own.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Protocol

from cluster.protocol import WorkerStats


@dataclass(frozen=True)
class WorkerRecord:
    """A worker's advertised state (refreshed on every heartbeat): its WorkerStats plus the URL it is reached at.

    Built on the worker with `from_stats` (the one conversion). Stored as JSON; `from_json` ignores keys it
    does not know (a newer worker's fields) and reads the counters an older worker kept in an `extra` dict.
    """

    worker_id: str
    url: str
    base_model: str
    num_running: int = 0
    num_waiting: int = 0
    max_num_seqs: int = 1
    device_adapters: tuple[str, ...] = ()
    host_adapters: tuple[str, ...] = ()
    is_ready: bool = True
    is_draining: bool = False
    num_active: int = 0
    num_free_kv_blocks: int = 0
    num_total_kv_blocks: int = 0
    num_cache_hits: int = 0
    num_cache_misses: int = 0
    num_adapter_loads: int = 0
    num_adapter_unloads: int = 0
    num_load_failures: int = 0
    # engine adapter cache (device tier): hits/misses at admission, evictions, prefetches, timed loads
    num_adapter_hits: int = 0
    num_adapter_misses: int = 0
    num_adapter_evictions: int = 0
    num_adapter_prefetches: int = 0
    num_timed_adapter_loads: int = 0
    adapter_load_seconds_total: float = 0.0
    # cold adapters: prefills run on the host copy while the copy lands (CPU-assisted), requests that waited
    num_cpu_assisted_prefills: int = 0
    num_copy_waits: int = 0
    # page pool split (KV blocks, adapter pages, free pages)
    num_kv_pages_used: int = 0
    num_adapter_pages: int = 0
    num_free_pool_pages: int = 0
    # routing state (see WorkerStats)
    adapter_ranks: dict[str, int] = field(default_factory=dict)
    running_ranks: tuple[int, ...] = ()
    waiting_ranks: tuple[int, ...] = ()
    num_waiting_prompt_tokens: int = 0
    num_waiting_by_queue: tuple[int, ...] = ()
    num_waiting_by_tenant: dict[str, int] = field(default_factory=dict)
    decode_step_ms: float | None = None
    prefill_step_ms: float | None = None
    perf_model: dict[str, Any] | None = None
    kernel_choices: dict[str, str] = field(default_factory=dict)
    kernel_tuner_s: float = 0.0

    @classmethod
    def from_stats(cls, stats: WorkerStats, url: str) -> WorkerRecord:
        """The heartbeat record of a worker reached at `url` whose state is `stats`."""
        values = stats.model_dump()
        for name in _TUPLE_FIELDS:
            values[name] = tuple(values[name])
        return cls(url=url, **{name: values[name] for name in _FIELD_NAMES if name in values})

    def to_json(self) -> str:
        """Serialise for storage."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerRecord:
        """Parse a stored record (unknown keys are ignored; a legacy `extra` dict fills the counters)."""
        data: dict[str, Any] = json.loads(raw)
        legacy = data.pop("extra", None)
        if isinstance(legacy, dict):
            data = {**legacy, **data}
        for name in _TUPLE_FIELDS:
            data[name] = tuple(data.get(name) or ())
        return cls(**{name: value for name, value in data.items() if name in _FIELD_NAMES})


_FIELD_NAMES = frozenset(f.name for f in fields(WorkerRecord))
_TUPLE_FIELDS = ("device_adapters", "host_adapters", "running_ranks", "waiting_ranks", "num_waiting_by_queue")


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
        ids = sorted(i.decode() if isinstance(i, bytes) else i for i in self._client.smembers(self._prefix + "index"))
        if not ids:
            return []
        raws = self._client.mget([self._prefix + i for i in ids])
        live, stale = [], []
        for worker_id, raw in zip(ids, raws):
            (live.append(WorkerRecord.from_json(raw)) if raw is not None else stale.append(worker_id))
        if stale:
            self._client.srem(self._prefix + "index", *stale)
        return live
