"""Baseline placements the LoRAServe placement is compared with (benchmarks/cluster.py), and the table of
every placement policy by name (`PLACEMENT_POLICIES`: loraserve, random, contiguous, replicated
(scheduler/placement/replicated_placement.py), and demand_only: no rows, routing alone, demand still published).

Both give every adapter exactly one holder, ignore demand and rank, and are stable (the same adapters and
workers give the same table, so they never move anything by themselves):
- `random`: a worker drawn by a hash of the adapter key (seeded), as a blind sharded deployment would;
- `contiguous`: adapters sorted by key, split into equal contiguous runs, one run per worker (sorted by id).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

from scheduler.placement.placement import (
    AdapterDemand,
    Placement,
    PlacementConfig,
    RoutingRow,
    compute_placement,
    placement_of_table,
    rank_bucket,
)
from scheduler.placement.replicated_placement import compute_replicated_placement

PlacementPolicy = Callable[
    [Sequence[AdapterDemand], Sequence[str], Mapping[str, RoutingRow], PlacementConfig], Placement
]


def random_placement(
    adapters: Sequence[AdapterDemand],
    worker_ids: Sequence[str],
    previous: Mapping[str, RoutingRow],
    config: PlacementConfig,
) -> Placement:
    """Each adapter on one worker chosen by a seeded hash of its key."""
    workers = sorted(set(worker_ids))

    def pick(key: str) -> str:
        digest = hashlib.sha256(f"lorahost-random-placement:{key}".encode()).digest()
        return workers[int.from_bytes(digest[:8], "big") % len(workers)]

    return _single_holder_placement(
        adapters,
        workers,
        previous,
        config,
        {a.adapter_key: pick(a.adapter_key) for a in adapters} if workers else {},
    )


def contiguous_placement(
    adapters: Sequence[AdapterDemand],
    worker_ids: Sequence[str],
    previous: Mapping[str, RoutingRow],
    config: PlacementConfig,
) -> Placement:
    """Adapters sorted by key, cut into len(workers) contiguous runs of (nearly) equal count."""
    workers = sorted(set(worker_ids))
    keys = sorted(a.adapter_key for a in adapters)
    holder = {key: workers[i * len(workers) // len(keys)] for i, key in enumerate(keys)} if workers else {}
    return _single_holder_placement(adapters, workers, previous, config, holder)


def _single_holder_placement(
    adapters: Sequence[AdapterDemand],
    workers: list[str],
    previous: Mapping[str, RoutingRow],
    config: PlacementConfig,
    holder: Mapping[str, str],
) -> Placement:
    if not workers:
        return Placement(table={}, workers=(), target_load=0.0)
    buckets = list(config.operating_points)
    table: dict[str, RoutingRow] = {key: ((worker, 1.0),) for key, worker in holder.items()}
    loads = {
        a.adapter_key: config.load(a.rank, a.demand_tokens_per_s)
        for a in adapters
        if a.demand_tokens_per_s > 0
    }
    bucket_of = {a.adapter_key: rank_bucket(a.rank, buckets) for a in adapters}
    return placement_of_table(table, workers, previous, loads, bucket_of)


def no_placement(
    adapters: Sequence[AdapterDemand],
    worker_ids: Sequence[str],
    previous: Mapping[str, RoutingRow],
    config: PlacementConfig,
) -> Placement:
    """No routing rows at all: every ready worker is eligible for every adapter and the router alone decides
    (the placement job still publishes the demand the autoscaler reads). Per-worker load is 0: nothing is
    placed."""
    return _single_holder_placement(adapters, sorted(set(worker_ids)), previous, config, {})


PLACEMENT_POLICIES: dict[str, PlacementPolicy] = {
    "loraserve": compute_placement,
    "random": random_placement,
    "contiguous": contiguous_placement,
    "replicated": compute_replicated_placement,
    "demand_only": no_placement,
}
DEFAULT_PLACEMENT_POLICY = "demand_only"  # = settings/capacity.py PlacementSettings.policy
