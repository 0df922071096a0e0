"""The published placement: the routing table (adapter key -> ((worker id, weight), ...)) and what the
autoscaler reads with it (per base model demand), in Redis or in process.

The placement job (registry/placement_job.py) computes it and `publish`es it; API servers keep a
`CachedRoutingTable` refreshed on a timer and read rows from it on the request path (never a network call per
request). `RedisRoutingTableStore` keeps one JSON key (the version comes from an INCR on a second key, so
versions only grow even with two publishers); `InMemoryRoutingTableStore` serves embedded mode.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

RoutingRow = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class WorkerPlacement:
    """One worker's share of the placement: load in server-equivalents (1 = its capacity), max rank bucket of
    its loaded adapters, number of adapters assigned."""

    worker_id: str
    base_model: str
    load: float
    max_rank: int
    num_adapters: int


@dataclass(frozen=True)
class ModelDemand:
    """One base model's demand as the job saw it: forecast and cooldown-peak tokens/s per adapter rank (keys
    are ranks, 0 = the base model itself) and when its last request started (unix s; None: none on record)."""

    base_model: str
    demand_by_rank: dict[int, float] = field(default_factory=dict)
    peak_demand_by_rank: dict[int, float] = field(default_factory=dict)
    last_request_at: float | None = None


@dataclass(frozen=True)
class RoutingTable:
    """A published placement. version 0 = never published; computed_at in unix seconds."""

    version: int
    computed_at: float
    rows: dict[str, RoutingRow] = field(default_factory=dict)
    workers: tuple[WorkerPlacement, ...] = ()
    moved: tuple[str, ...] = ()
    demand: tuple[ModelDemand, ...] = ()

    def to_json(self) -> str:
        """Serialise for storage."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> RoutingTable:
        """Parse a stored table."""
        data: dict[str, Any] = json.loads(raw)
        return cls(
            version=int(data["version"]),
            computed_at=float(data["computed_at"]),
            rows={k: tuple((str(w), float(p)) for w, p in row) for k, row in data.get("rows", {}).items()},
            workers=tuple(WorkerPlacement(**w) for w in data.get("workers", ())),
            moved=tuple(data.get("moved", ())),
            demand=tuple(_model_demand(d) for d in data.get("demand", ())),
        )


def _model_demand(data: dict[str, Any]) -> ModelDemand:
    return ModelDemand(
        base_model=data["base_model"],
        demand_by_rank={int(r): float(d) for r, d in data.get("demand_by_rank", {}).items()},
        peak_demand_by_rank={int(r): float(d) for r, d in data.get("peak_demand_by_rank", {}).items()},
        last_request_at=data.get("last_request_at"),
    )


class RoutingTableStore(Protocol):
    """Where the placement job publishes the routing table and API servers read it."""

    def read(self) -> RoutingTable | None:
        """The newest published table, or None before the first publish."""
        ...

    def publish(self, table: RoutingTable) -> RoutingTable:
        """Store `table` under the next version (its own version is ignored); returns what was stored."""
        ...


class InMemoryRoutingTableStore:
    """Process-local store for embedded mode."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: RoutingTable | None = None

    def read(self) -> RoutingTable | None:
        """The newest published table, or None."""
        with self._lock:
            return self._table

    def publish(self, table: RoutingTable) -> RoutingTable:
        """Store `table` under the next version."""
        with self._lock:
            stored = replace(table, version=(self._table.version if self._table else 0) + 1)
            self._table = stored
            return stored


class RedisRoutingTableStore:
    """Redis-backed store: `<prefix>table` holds the JSON table, `<prefix>version` the version counter."""

    def __init__(self, client: Any, key_prefix: str = "lorahost:placement:") -> None:
        self._client = client
        self._prefix = key_prefix

    def read(self) -> RoutingTable | None:
        """The newest published table, or None."""
        raw = self._client.get(self._prefix + "table")
        return None if raw is None else RoutingTable.from_json(raw)

    def publish(self, table: RoutingTable) -> RoutingTable:
        """Store `table` under the next version (INCR: versions grow even with concurrent publishers)."""
        stored = replace(table, version=int(self._client.incr(self._prefix + "version")))
        self._client.set(self._prefix + "table", stored.to_json())
        return stored


class CachedRoutingTable:
    """An API server's copy of the table: `refresh` (on a timer) reads the store; `row` reads memory only.

    A failed refresh keeps the last copy (routing continues on the last view while Redis is away).
    """

    def __init__(self, store: RoutingTableStore) -> None:
        self.store = store
        self._table: RoutingTable | None = None

    @property
    def table(self) -> RoutingTable | None:
        """The cached table (None before the first successful refresh of a published one)."""
        return self._table

    def refresh(self) -> RoutingTable | None:
        """Re-read the store; keeps the last copy when the store cannot be read (the error propagates)."""
        table = self.store.read()
        if table is not None:
            self._table = table
        return self._table

    def row(self, adapter_key: str | None) -> RoutingRow:
        """The adapter's ((worker id, weight), ...) row; () for no adapter, no table or an unplaced one."""
        if adapter_key is None or self._table is None:
            return ()
        return self._table.rows.get(adapter_key, ())
