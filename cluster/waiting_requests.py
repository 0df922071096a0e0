"""Requests waiting in API servers' cold starts, per base model, summed over every API replica.

The autoscaling signal for scale-from-zero (api/scaling_view.py): a request that waits on one replica must
count whichever replica the autoscaler polls. Each API server publishes its counts every
settings.routing.table_refresh_s under its own key with a TTL (a dead replica's counts expire with it);
`RedisWaitingRequests.totals` sums the live keys. `LocalWaitingRequests` serves one process (embedded mode).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any, Protocol


class WaitingRequests(Protocol):
    """Where API servers publish their cold-start waiters and the autoscaler reads the totals."""

    def publish(self, instance_id: str, counts: Mapping[str, int], ttl_s: float) -> None:
        """Replace this API server's counts (base model -> waiting requests); they expire after ttl_s."""
        ...

    def totals(self) -> dict[str, int]:
        """Waiting requests per base model over every API server whose counts have not expired."""
        ...


class LocalWaitingRequests:
    """One process's counts (embedded mode: the API server is the only one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}

    def publish(self, instance_id: str, counts: Mapping[str, int], ttl_s: float) -> None:
        """Replace this API server's counts (never expire: the process is the only one)."""
        with self._lock:
            self._counts[instance_id] = {k: v for k, v in counts.items() if v > 0}

    def totals(self) -> dict[str, int]:
        """The sum over published counts."""
        with self._lock:
            return _sum(self._counts.values())


class RedisWaitingRequests:
    """One JSON key per API server with a TTL, plus an index set of their ids (stale ids are pruned)."""

    def __init__(self, client: Any, key_prefix: str = "lorahost:waiting:") -> None:
        self._client = client
        self._prefix = key_prefix

    def publish(self, instance_id: str, counts: Mapping[str, int], ttl_s: float) -> None:
        """Replace this API server's counts; they expire after ttl_s."""
        pipe = self._client.pipeline()
        pipe.set(
            self._prefix + instance_id,
            json.dumps({k: v for k, v in counts.items() if v > 0}),
            px=max(1, int(ttl_s * 1000)),
        )
        pipe.sadd(self._prefix + "index", instance_id)
        pipe.execute()

    def totals(self) -> dict[str, int]:
        """The sum over API servers whose counts have not expired."""
        ids = sorted(
            i.decode() if isinstance(i, bytes) else i for i in self._client.smembers(self._prefix + "index")
        )
        if not ids:
            return {}
        raws = self._client.mget([self._prefix + i for i in ids])
        stale = [i for i, raw in zip(ids, raws) if raw is None]
        if stale:
            self._client.srem(self._prefix + "index", *stale)
        return _sum(json.loads(raw) for raw in raws if raw is not None)


def _sum(counts: Any) -> dict[str, int]:
    totals: dict[str, int] = {}
    for per_model in counts:
        for model, num in per_model.items():
            totals[model] = totals.get(model, 0) + int(num)
    return totals
