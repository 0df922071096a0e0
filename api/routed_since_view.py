"""The requests this API process routed to each worker since that worker's view was published: the local
correction that keeps a least-loaded router from herding on a cached view (scheduler/routing/unseen.py).

A worker's view is its heartbeat record (cluster/membership.py), read at most once per
`routing.worker_view_cache_s` (cluster/worker_listing.py) from a heartbeat sent every
`worker.heartbeat_interval_s`. Per worker this keeps the record its view came from and the requests routed
there since (`RoutedSinceView.routed`); `views(records)` gives the router each worker's view with those
requests counted as queued. The count restarts when a record with different content arrives (a new heartbeat
that shows the worker's state after them); a re-read of the same content (the listing refreshed, the worker
not yet heartbeated) keeps it. A request that ends (`finished`: its stream closed, or it never started
there) leaves the count if it is still in it; one counted before the current record is already in that
record and is not subtracted twice.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from cluster.membership import WorkerRecord
from cluster.worker_view import worker_view
from scheduler.routing.router import RouteRequest, WorkerView
from scheduler.routing.unseen import UnseenRequests, with_unseen


@dataclass(eq=False)
class _Since:
    """One worker's record and the requests routed there since it was published."""

    record: WorkerRecord
    view: WorkerView  # worker_view(record)
    num_prompt_tokens: int = 0
    ranks: list[int] = field(default_factory=list)
    num_by_tenant: Counter[str] = field(default_factory=Counter)
    corrected: WorkerView | None = None  # `view` with the requests counted (None: to be built)

    def corrected_view(self) -> WorkerView:
        if self.corrected is None:
            unseen = UnseenRequests(
                num_requests=len(self.ranks),
                num_prompt_tokens=self.num_prompt_tokens,
                ranks=tuple(self.ranks),
                num_by_tenant=+self.num_by_tenant,
            )
            self.corrected = with_unseen(self.view, unseen)
        return self.corrected


@dataclass(eq=False)
class RoutedRequest:
    """A request counted on a worker (`RoutedSinceView.routed`); pass it to `finished` when it ends."""

    since: _Since
    worker_id: str
    request: RouteRequest
    is_finished: bool = False


class RoutedSinceView:
    """Per worker, the requests routed since its view was published (module doc). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_worker: dict[str, _Since] = {}

    def views(self, records: Iterable[WorkerRecord]) -> list[WorkerView]:
        """The router's view of each record, with the requests routed there since it was published counted as
        queued. Workers not in `records` are forgotten."""
        with self._lock:
            by_worker = {r.worker_id: self._since(r) for r in records}
            self._by_worker = by_worker
            return [since.corrected_view() for since in by_worker.values()]

    def _since(self, record: WorkerRecord) -> _Since:
        since = self._by_worker.get(record.worker_id)
        if since is None or (since.record is not record and since.record != record):
            return _Since(record, worker_view(record))  # a new heartbeat: it shows what was routed before
        since.record = record  # the same content read again: the worker has not heartbeated since
        return since

    def routed(self, record: WorkerRecord, request: RouteRequest) -> RoutedRequest:
        """Count `request` as routed to the worker of `record` (read by `views` beforehand)."""
        with self._lock:
            since = self._by_worker.get(record.worker_id) or self._since(record)
            self._by_worker[record.worker_id] = since
            since.ranks.append(request.adapter_rank)
            since.num_prompt_tokens += request.num_prompt_tokens
            if request.tenant_id is not None:
                since.num_by_tenant[request.tenant_id] += 1
            since.corrected = None
            return RoutedRequest(since, record.worker_id, request)

    def finished(self, routed: RoutedRequest) -> None:
        """The request ended (or never started there): it leaves the count if its worker's view is still the
        one it was counted against."""
        with self._lock:
            since = routed.since
            if routed.is_finished or self._by_worker.get(routed.worker_id) is not since:
                return
            routed.is_finished = True
            request = routed.request
            since.ranks.remove(request.adapter_rank)
            since.num_prompt_tokens = max(0, since.num_prompt_tokens - request.num_prompt_tokens)
            if request.tenant_id is not None and since.num_by_tenant[request.tenant_id] > 0:
                since.num_by_tenant[request.tenant_id] -= 1
            since.corrected = None
