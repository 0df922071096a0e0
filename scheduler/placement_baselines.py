"""Baseline placements the LoRAServe placement is compared with (benchmarks/cluster.py), chosen by name.

Both give every adapter exactly one holder, ignore demand and rank, and are stable (the same adapters and
workers give the same table, so they never move anything by themselves):
- `random`: a worker drawn by a hash of the adapter key (seeded), as a blind sharded deployment would;
- `contiguous`: adapters sorted by key, split into equal contiguous runs, one run per worker (sorted by id).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

from scheduler.placement import (
    AdapterDemand,
    Placement,
    PlacementConfig,
    RoutingRow,
    WorkerLoad,
    compute_placement,
    rank_bucket,
)

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
    load = {w: 0.0 for w in workers}
    max_rank = {w: 0 for w in workers}
    count = {w: 0 for w in workers}
    for a in adapters:
        worker = holder[a.adapter_key]
        count[worker] += 1
        if a.demand_tokens_per_s > 0:
            load[worker] += config.load(a.rank, a.demand_tokens_per_s)
            max_rank[worker] = max(max_rank[worker], rank_bucket(a.rank, buckets))
    moved = tuple(
        sorted(
            k for k, row in table.items() if previous.get(k) and row[0][0] not in {w for w, _ in previous[k]}
        )
    )
    live = set(workers)
    dropped: dict[str, list[str]] = {}
    for key, row in previous.items():
        for worker, _ in row:
            if worker in live and table.get(key, ((None, 0.0),))[0][0] != worker:
                dropped.setdefault(worker, []).append(key)
    return Placement(
        table=table,
        workers=tuple(WorkerLoad(w, load[w], max_rank[w], count[w]) for w in workers),
        target_load=sum(load.values()) / len(workers),
        moved=moved,
        dropped={w: tuple(sorted(keys)) for w, keys in sorted(dropped.items())},
    )


PLACEMENT_POLICIES: dict[str, PlacementPolicy] = {
    "loraserve": compute_placement,
    "random": random_placement,
    "contiguous": contiguous_placement,
}
DEFAULT_PLACEMENT_POLICY = "loraserve"
