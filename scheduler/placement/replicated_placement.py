"""Demand-replicated placement: an adapter's number of holders follows its demand (S-LoRA / dLoRA /
LoRAServe-style replication), ranks stay apart where they can, and adapter memory per worker is respected.
Routing then spreads an adapter's requests over its holders by live load (scheduler/routing/
holder_router.py). Pure: plain data in, a `Placement` out.

Why: LoRAServe's packing (placement.py) gives an adapter a second holder only where its forecast load
overflows a worker's target share, so with a capacity model that misprices a rank the hottest adapter sits
alone on one worker (the twin: 87 of 89 adapters with one holder, the hottest, 19% of requests, on one
worker that took 211 of 486 requests; benchmarks/RESULTS.md, issue 36).

Every period, for the adapters of one base model on its N live workers:

  load_a = demand_a / OP[bucket(a)]        server-equivalents (placement.py's capacity model)
  u*     = sum_a load_a / N                every worker's target load
  x_a    = demand_a / sum demand x N x headroom    (its share of the demand in tokens/s, not of the
                                           load: a capacity model that misprices a rank must not leave
                                           a hot adapter with too few holders)
  h_a    = min(N, max(1, ceil(x_a)))       holders; hysteresis: an adapter with h_prev live holders keeps
                                           them while h_prev - 1 - hysteresis < x_a <= h_prev

- Bins: N logical bins, apportioned to rank buckets by their load (placement.apportion, LoRAServe's rule).
- Replicas (load_a / h_a each): adapters by descending bucket, then load, then key, all replicas of one
  adapter at once; a second or later replica only while the memory left still holds one copy of every
  adapter after it (coverage before replication). A replica goes to a bin that
  does not hold its adapter and has memory for it (sum of held ranks + rank <= max_worker_rank_sum), the
  first by: fits the target (load + replica <= u*), does not raise the bin's max bucket (its batches pay
  no more padding), is of the adapter's own bucket, least loaded, lowest index. A replica that no bin has
  memory for is not placed (fewer holders); an adapter with no holder has no row, and the router then
  sends it to any ready worker, as without a placement.
- Permutation onto workers: the maximum-overlap assignment with the previous table (placement.py), so an
  unchanged demand reproduces the previous table (a fixed point) and a shift moves few adapters; workers
  pull a newly assigned adapter on its first request (lazy migration, as for LoRAServe's table).
- Weights: equal among an adapter's holders (the router spreads by load, not by weight).
- Zero-demand adapters (and keys only in `previous`): one holder, their previous live holder of largest
  weight if it has memory, else the worker with memory of highest max bucket, then least loaded, fewest
  adapters, id. They count in memory, not in load.

Measured (cluster twin, H100 8B profile, 4 workers, 100 adapters, 2 seeds; benchmarks/twin_loraserve.py, issue 36): with
`holders_least_loaded` it keeps the worker holding a 20%-of-requests adapter at 1.14x the mean load
(LoRAServe's table: 1.63x), wins 1.45x at P95 TTFT over placement-free least-loaded routing where kernels pad
rank 128 to 2.7x rank 8, and trails it by 2.5-4% where padding is 1.32x and memory is plentiful: pinning an
adapter to few holders pays when memory per worker binds (`max_worker_rank_sum`), not otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from scheduler.placement.placement import (
    AdapterDemand,
    Placement,
    PlacementConfig,
    RoutingRow,
    _assign_bins,
    _Bin,
    _max_bucket,
    _normalised,
    apportion,
    placement_of_table,
    rank_bucket,
)

_EPS = 1e-9


def holder_count(need: float, num_previous: int, num_workers: int, hysteresis: float) -> int:
    """Holders for an adapter needing `need` workers' worth of replicas (x_a above), with `num_previous` live
    holders now: ceil(need), kept at num_previous while num_previous - 1 - hysteresis < need <= num_previous;
    at least 1, at most num_workers."""
    count = max(1, math.ceil(need - _EPS))
    if num_previous > count and need > num_previous - 1 - hysteresis:
        count = num_previous
    return min(num_workers, max(1, count))


def compute_replicated_placement(
    adapters: Sequence[AdapterDemand],
    worker_ids: Sequence[str],
    previous: Mapping[str, RoutingRow],
    config: PlacementConfig,
) -> Placement:
    """Place `adapters` on the live `worker_ids`, replicas following demand (module doc)."""
    workers = sorted(set(worker_ids))
    if not workers:
        return Placement(table={}, workers=(), target_load=0.0)
    known = {a.adapter_key for a in adapters}
    adapters = [*adapters, *(AdapterDemand(key, 0, 0.0) for key in sorted(previous) if key not in known)]
    buckets = list(config.operating_points)
    bucket_of = {a.adapter_key: rank_bucket(a.rank, buckets) for a in adapters}
    rank_of = {a.adapter_key: a.rank for a in adapters}
    loads = {
        a.adapter_key: config.load(a.rank, a.demand_tokens_per_s)
        for a in adapters
        if a.demand_tokens_per_s > 0
    }
    target = sum(loads.values()) / len(workers)
    demand = {a.adapter_key: a.demand_tokens_per_s for a in adapters if a.adapter_key in loads}
    total_demand = sum(demand.values())
    live = set(workers)
    counts = {
        key: holder_count(
            demand[key] / total_demand * len(workers) * config.replication_headroom,
            sum(1 for w, _ in previous.get(key, ()) if w in live),
            len(workers),
            config.replication_hysteresis,
        )
        for key in loads
    }
    rank_sums = [0] * len(workers)
    bins = _replicate(loads, counts, bucket_of, rank_of, rank_sums, target, config.max_worker_rank_sum)
    order = _assign_bins(bins, workers, previous, loads) if loads else list(range(len(workers)))
    holders: dict[str, list[tuple[str, float]]] = {}
    for i, b in enumerate(bins):
        for key, load in b.pieces.items():
            holders.setdefault(key, []).append((workers[order[i]], load))
    table = {key: _normalised(row) for key, row in holders.items()}
    worker_rank_sum = {workers[order[i]]: rank_sums[i] for i in range(len(workers))}
    idle = sorted((k for k in rank_of if k not in loads), key=lambda k: (-bucket_of[k], k))
    _place_idle(table, idle, rank_of, bucket_of, loads, worker_rank_sum, previous, config.max_worker_rank_sum)
    return placement_of_table(table, workers, previous, loads, bucket_of)


def _replicate(
    loads: Mapping[str, float],
    counts: Mapping[str, int],
    bucket_of: Mapping[str, int],
    rank_of: Mapping[str, int],
    rank_sums: list[int],
    target: float,
    max_rank_sum: int | None,
) -> list[_Bin]:
    """The logical bins with every adapter's replicas (module doc); `rank_sums[i]` is bin i's memory."""
    units: dict[int, float] = {}
    for key, load in loads.items():
        units[bucket_of[key]] = units.get(bucket_of[key], 0.0) + load
    per_bucket = apportion(units, len(rank_sums))
    bins = [_Bin(bucket) for bucket in sorted(per_bucket, reverse=True) for _ in range(per_bucket[bucket])]
    bins += [_Bin(0) for _ in range(len(rank_sums) - len(bins))]  # no demand at all: unlabelled bins
    ordered = sorted(loads, key=lambda k: (-bucket_of[k], -loads[k], k))
    room = None if max_rank_sum is None else max_rank_sum * len(rank_sums)
    uncovered = sum(rank_of[k] for k in ordered)  # memory the first replicas still to place need
    for key in ordered:
        uncovered -= rank_of[key]
        for replica in range(counts[key]):
            # a second replica only where the first ones of the adapters after it still fit (coverage first)
            if replica and room is not None and room - sum(rank_sums) - rank_of[key] < uncovered:
                break
            piece = loads[key] / counts[key]
            i = _best_bin(bins, rank_sums, key, piece, bucket_of, rank_of[key], target, max_rank_sum)
            if i is None:
                break
            bins[i].add(key, piece)
            rank_sums[i] += rank_of[key]
    return bins


def _best_bin(
    bins: list[_Bin],
    rank_sums: list[int],
    key: str,
    piece: float,
    bucket_of: Mapping[str, int],
    rank: int,
    target: float,
    max_rank_sum: int | None,
) -> int | None:
    """The bin for one replica of `key` (module doc's order), or None when none has memory for it."""
    bucket = bucket_of[key]
    open_bins = [
        i
        for i, b in enumerate(bins)
        if key not in b.pieces and (max_rank_sum is None or rank_sums[i] + rank <= max_rank_sum)
    ]
    if not open_bins:
        return None
    return min(
        open_bins,
        key=lambda i: (
            bins[i].load + piece > target * (1 + _EPS) + _EPS,
            _max_bucket(bins[i], bucket_of) < bucket,
            bins[i].bucket != bucket,
            bins[i].load,
            i,
        ),
    )


def _place_idle(
    table: dict[str, RoutingRow],
    keys: list[str],
    rank_of: Mapping[str, int],
    bucket_of: Mapping[str, int],
    loads: Mapping[str, float],
    rank_sum: dict[str, int],
    previous: Mapping[str, RoutingRow],
    max_rank_sum: int | None,
) -> None:
    """One holder per zero-demand adapter where memory allows (module doc)."""
    load = {w: 0.0 for w in rank_sum}
    max_bucket = {w: 0 for w in rank_sum}
    count = {w: 0 for w in rank_sum}
    for key, row in table.items():
        for worker, weight in row:
            load[worker] += weight * loads[key]
            max_bucket[worker] = max(max_bucket[worker], bucket_of[key])
            count[worker] += 1
    for key in keys:
        room = [w for w in rank_sum if max_rank_sum is None or rank_sum[w] + rank_of[key] <= max_rank_sum]
        before = [(w, weight) for w, weight in previous.get(key, ()) if w in room]
        if before:
            worker = min(before, key=lambda h: (-h[1], h[0]))[0]
        elif room:
            worker = min(room, key=lambda w: (-max_bucket[w], load[w], count[w], w))
        else:
            continue
        table[key] = ((worker, 1.0),)
        rank_sum[worker] += rank_of[key]
        count[worker] += 1
