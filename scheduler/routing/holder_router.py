"""Replica-aware routing (`holders_least_loaded`): an adapter's requests spread over its holders by load,
fitted to ranks, and yield to load once every holder is past a stated bound. Pure: plain data in, a decision
out. Loads are `tenant_load` (requests per batch slot, `WorkerView.load`'s unit); `max_load_gap` is the bound.

  holders = the placement's row for the adapter (`eligible_workers`: every ready worker when no row is
            published or none of its holders is live)
  bound      = the least load of the routable workers (ready, base model, rank served) + max_load_gap
  candidates = the holders within the bound; if none, every routable worker within the bound (the request
               spills; that worker pulls the adapter on first use, the placement's lazy migration)
  choice     = `best_fit` of the candidates: the worker whose batches the request's rank fits best
               (`rank_mismatch`: raising the batch's largest rank costs every request there with padded
               kernels), then adapter residency, then load, then id.

So a request never goes to a non-holder while some holder is within the bound, and no worker it picks is
busier than the least-loaded routable worker by more than the bound.
`residency_least_loaded` applies the same bound when `max_load_gap` is set (`yield_to_load`).

Why load and not the placement's weights: weights come from a forecast and a capacity model that can both
be wrong (LoRAServe's table priced rank 128 at 2.7x rank 8 on a profile where it costs 1.32x, and the
hottest adapter's single worker took 211 of 486 requests, benchmarks/RESULTS.md), while load is measured.
Why a band and not strict least-loaded: within a few queued requests, fitting the rank (no padding for a
whole batch) and a resident copy are worth more than the last bit of balance. DEFAULT_MAX_LOAD_GAP 0.0625
(8 requests at max_num_seqs 128) was the best of 0.0625 / 0.125 / 0.25 in the cluster twin on both seeds
(benchmarks/twin_loraserve.py, H100 profile): at 0.25 the band costs balance (up to 1.6x the mean load per
worker in the 2.7x-padding what-if) for no TTFT gain; 0.0625 was no worse than 0.125 anywhere.
Least-loaded is exact when views are fresh (the cluster twin); with views a heartbeat old and cached for
`routing.worker_view_cache_s`, requests in one window would pile onto one worker: the API counts the
requests it routed to each worker since its view was published as queued there (scheduler/routing/unseen.py,
api/routed_since_view.py), so a burst spreads.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.routing.router import (
    DEFAULT_MAX_LOAD_GAP,
    RouteRequest,
    RouterOptions,
    WorkerView,
    best_fit,
    eligible_workers,
    routable,
    tenant_load,
    within_gap,
)


class HoldersLeastLoaded:
    """The least-loaded of the adapter's holders, yielding to the least-loaded worker beyond `max_load_gap`
    (module doc)."""

    def __init__(self, max_load_gap: float = DEFAULT_MAX_LOAD_GAP) -> None:
        if max_load_gap < 0:
            raise ValueError(f"max_load_gap must be >= 0, not {max_load_gap}")
        self.max_load_gap = max_load_gap

    @classmethod
    def from_options(cls, options: RouterOptions) -> HoldersLeastLoaded:
        """Built from settings: `options.max_load_gap`, or DEFAULT_MAX_LOAD_GAP when not set."""
        gap = options.max_load_gap
        return cls(DEFAULT_MAX_LOAD_GAP if gap is None else gap)

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> str | None:
        """The chosen worker id, or None when no ready worker serves the request."""
        holders = [w for w, _ in eligible_workers(request, workers)]
        if not holders:
            return None
        tenant = request.tenant_id
        pool = routable(request, workers) or holders
        bound = min(tenant_load(w, tenant) for w in pool) + self.max_load_gap
        near = [w for w in holders if tenant_load(w, tenant) <= bound]
        # every holder past the bound: yield to load (the least-loaded workers anywhere)
        return best_fit(request, near or within_gap(request, pool, self.max_load_gap)).worker_id
