"""LoRAServe placement: rank-bucketed fractional packing of adapters onto workers, with minimal movement.

Pure: plain data in, a `Placement` out (numpy/scipy only). One call places the adapters of one base model on
that base model's live workers. Every period (registry/placement_job.py):

  d_a  = forecast demand of adapter a (tokens/s, scheduler/placement/demand_forecast.py)
  U_r  = sum over adapters in rank bucket r of d_a / OP[r]      server-equivalents
  u*   = sum_r U_r / N                                          every worker's target load (N live workers)
  B_r  = U_r / u* rounded by largest remainder                  logical bins (workers) of rank bucket r

Decisions the paper leaves open, taken here:
- Rank buckets are the keys of the operating points (default 8, 16, 32, 64, 128, 256); a rank belongs to the
  smallest bucket >= it (above the largest: the largest). OP[r] (tokens/s one worker sustains at rank r within
  the SLO) is an input; `default_operating_points` derives it from one rank-0 capacity with LoRAServe's
  measured slope (rank-128 prefill costs 2.7x rank 8: OP[r] = OP[0] / (1 + 0.016 r)) until a profile is
  fitted.
- Rounding: Hamilton's largest remainder, so sum B_r == N always (ties go to the higher rank: its padding
  costs most when mixed). A bucket with U_r > 0 may get B_r = 0; its adapters become leftovers.
- Packing: within a bucket, adapters by descending load fill its bins in order, each bin up to u*; an adapter
  that does not fit is split (the rest goes to the next bin), so at most B_r - 1 adapters split per bucket.
  What does not fit the bucket's bins is a leftover.
- Leftovers: by descending rank, onto the bin with room whose max rank is highest (ties: least loaded, then
  lowest index); split over bins when larger than the room. A bin's max rank starts at its bucket, so a
  leftover of lower rank lands where it raises no padding whenever any bin with room allows it.
- Minimum share: a piece below `min_phi` of its adapter's load is merged into that adapter's largest piece
  (routing weights below a few percent only spread cold starts).
- Overload (u* > 1): packed the same way (every worker equally over its capacity); `is_overloaded` tells
  the autoscaler (scheduler/scaling/scaling.py uses the same capacity model).
- Permutation: logical bins go to physical workers by a maximum-overlap assignment with the previous placement
  (scipy's Hungarian solver; overlap counts adapters a worker already holds, then their shares), so unchanged
  demand and workers reproduce the previous table exactly (a fixed point) and a change moves few adapters.
- Adapters with zero forecast demand (and every key of the previous table: to forget an adapter, leave it
  out of `previous`; it is placed as a zero-demand adapter of the smallest bucket) keep exactly one
  holder: their previous live holder with the largest weight (no movement), else the leftover rule. They
  carry no load and do not count in a worker's max rank (nothing runs with them).
No live worker: the placement is empty (requests then go to any ready worker of the base model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

DEFAULT_RANK_BUCKETS: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
RANK_COST_PER_UNIT = (
    0.016  # (1 + 0.016 * 128) / (1 + 0.016 * 8) = 2.7: LoRAServe's rank-128 vs rank-8 prefill
)
DEFAULT_MIN_PHI = 0.05
DEFAULT_REPLICATION_HEADROOM, DEFAULT_REPLICATION_HYSTERESIS = 1.5, 0.25  # replicated_placement.py
_EPS = 1e-12

RoutingRow = tuple[tuple[str, float], ...]


def default_operating_points(
    tokens_per_s_at_rank0: float, rank_buckets: Sequence[int] = DEFAULT_RANK_BUCKETS
) -> dict[int, float]:
    """OP[r] for each bucket from one worker's capacity without LoRA: OP[0] / (1 + RANK_COST_PER_UNIT * r)."""
    if tokens_per_s_at_rank0 <= 0:
        raise ValueError(f"tokens_per_s_at_rank0 must be positive, not {tokens_per_s_at_rank0}")
    return {r: tokens_per_s_at_rank0 / (1 + RANK_COST_PER_UNIT * r) for r in rank_buckets}


def rank_bucket(rank: int, rank_buckets: Sequence[int]) -> int:
    """The smallest bucket >= rank (the largest bucket for ranks above it)."""
    ordered = sorted(rank_buckets)
    return next((b for b in ordered if b >= rank), ordered[-1])


@dataclass(frozen=True)
class AdapterDemand:
    """One adapter version to place: its key, LoRA rank and forecast demand in tokens/s (0 = idle)."""

    adapter_key: str
    rank: int
    demand_tokens_per_s: float


@dataclass(frozen=True)
class PlacementConfig:
    """operating_points: rank bucket -> tokens/s one worker sustains within the SLO (keys = the buckets).

    The replicated placement (scheduler/placement/replicated_placement.py) also reads: replication_headroom
    (holders = ceil(demand share x workers x this)), replication_hysteresis (how far below its current holder
    count an adapter's need must fall before it loses one) and max_worker_rank_sum (adapter memory per
    worker: the sum of the ranks of the adapters it holds; None = no limit)."""

    operating_points: Mapping[int, float]
    min_phi: float = DEFAULT_MIN_PHI
    replication_headroom: float = DEFAULT_REPLICATION_HEADROOM
    replication_hysteresis: float = DEFAULT_REPLICATION_HYSTERESIS
    max_worker_rank_sum: int | None = None

    def __post_init__(self) -> None:
        if not self.operating_points or min(self.operating_points.values()) <= 0:
            raise ValueError("operating_points needs at least one bucket, every one with a positive tokens/s")
        if not 0 <= self.min_phi < 0.5:
            raise ValueError(f"min_phi must be in [0, 0.5), not {self.min_phi}")
        if self.replication_headroom <= 0 or not 0 <= self.replication_hysteresis < 1:
            raise ValueError(f"need replication_headroom > 0, hysteresis in [0, 1), not {self!r}")
        if (self.max_worker_rank_sum or 1) <= 0:
            raise ValueError(f"max_worker_rank_sum must be positive or None, not {self.max_worker_rank_sum}")

    def load(self, rank: int, demand_tokens_per_s: float) -> float:
        """Server-equivalents of `demand_tokens_per_s` at `rank`."""
        return demand_tokens_per_s / self.operating_points[rank_bucket(rank, list(self.operating_points))]


@dataclass(frozen=True)
class WorkerLoad:
    """A worker's share: load in server-equivalents, the max rank bucket of its loaded adapters."""

    worker_id: str
    load: float
    max_rank: int
    num_adapters: int


@dataclass(frozen=True)
class Placement:
    """The routing table (adapter -> ((worker, weight), ...), weights summing to 1), per-worker load, the
    adapters that gained a holder they did not have (moved), and per worker the adapters it lost (dropped)."""

    table: dict[str, RoutingRow]
    workers: tuple[WorkerLoad, ...]
    target_load: float  # u*
    moved: tuple[str, ...] = ()
    dropped: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def is_overloaded(self) -> bool:
        """True when every worker is asked for more than its capacity (u* > 1)."""
        return self.target_load > 1 + 1e-9


@dataclass
class _Bin:
    bucket: int
    pieces: dict[str, float] = field(default_factory=dict)  # adapter -> load placed here

    @property
    def load(self) -> float:
        return sum(self.pieces.values())

    def add(self, key: str, load: float) -> None:
        self.pieces[key] = self.pieces.get(key, 0.0) + load


def compute_placement(
    adapters: Sequence[AdapterDemand],
    worker_ids: Sequence[str],
    previous: Mapping[str, RoutingRow],
    config: PlacementConfig,
) -> Placement:
    """Place `adapters` on the live `worker_ids` of one base model, moving little from `previous`."""
    workers = sorted(set(worker_ids))
    if not workers:
        return Placement(table={}, workers=(), target_load=0.0)
    buckets = list(config.operating_points)
    known = {a.adapter_key for a in adapters}
    adapters = [*adapters, *(AdapterDemand(key, 0, 0.0) for key in sorted(previous) if key not in known)]
    bucket_of = {a.adapter_key: rank_bucket(a.rank, buckets) for a in adapters}
    loads = {
        a.adapter_key: config.load(a.rank, a.demand_tokens_per_s)
        for a in adapters
        if a.demand_tokens_per_s > 0
    }
    target_load = sum(loads.values()) / len(workers)
    bins = _pack(loads, bucket_of, len(workers), target_load) if loads else []
    _merge_small_pieces(bins, loads, config.min_phi)
    order = _assign_bins(bins, workers, previous, loads) if bins else list(range(len(workers)))
    table = _rows_from_bins(bins, order, workers, loads)
    idle = sorted(
        (a for a in adapters if a.adapter_key not in loads),
        key=lambda a: (-bucket_of[a.adapter_key], a.adapter_key),
    )
    _place_idle(table, [a.adapter_key for a in idle], bucket_of, workers, previous, bins, order)
    return placement_of_table(table, workers, previous, loads, bucket_of)


def placement_of_table(
    table: dict[str, RoutingRow],
    workers: list[str],
    previous: Mapping[str, RoutingRow],
    loads: Mapping[str, float],
    bucket_of: Mapping[str, int],
) -> Placement:
    """The Placement of a finished routing table over `workers` (non-empty): per-worker load and max rank,
    u*, and the adapters moved / dropped against `previous`. loads: server-equivalents of the adapters with
    demand; bucket_of: every adapter's rank bucket."""
    return Placement(
        table=table,
        workers=_worker_loads(table, workers, loads, bucket_of),
        target_load=sum(loads.values()) / len(workers),
        moved=_moved(table, previous),
        dropped=_dropped(table, previous, workers),
    )


def apportion(units: Mapping[int, float], num_bins: int) -> dict[int, int]:
    """Hamilton's largest remainder: integer bins per bucket proportional to `units`, summing to num_bins."""
    total = sum(units.values())
    if total <= 0:
        return {r: 0 for r in units}
    quotas = {r: u / total * num_bins for r, u in units.items()}
    counts = {r: math.floor(q + 1e-9) for r, q in quotas.items()}
    by_remainder = sorted(units, key=lambda r: (-(quotas[r] - counts[r]), -r))
    for r in by_remainder[: max(0, num_bins - sum(counts.values()))]:
        counts[r] += 1
    return counts


def _pack(
    loads: Mapping[str, float], bucket_of: Mapping[str, int], num_bins: int, capacity: float
) -> list[_Bin]:
    """Bins per bucket (descending bucket), filled in order with splitting; leftovers by the leftover rule."""
    units: dict[int, float] = {}
    for key, load in loads.items():
        units[bucket_of[key]] = units.get(bucket_of[key], 0.0) + load
    counts = apportion(units, num_bins)
    bins: list[_Bin] = []
    leftovers: list[tuple[str, float]] = []
    for bucket in sorted(units, reverse=True):
        own = [_Bin(bucket) for _ in range(counts[bucket])]
        members = sorted((k for k in loads if bucket_of[k] == bucket), key=lambda k: (-loads[k], k))
        leftovers += _fill(own, [(k, loads[k]) for k in members], capacity)
        bins += own
    for key, load in sorted(leftovers, key=lambda kl: (-bucket_of[kl[0]], -kl[1], kl[0])):
        _place_leftover(bins, key, load, bucket_of, capacity)
    return bins


def _fill(bins: list[_Bin], items: list[tuple[str, float]], capacity: float) -> list[tuple[str, float]]:
    """Fill `bins` in order up to `capacity`, splitting items at bin edges; what does not fit comes back."""
    index = 0
    rest: list[tuple[str, float]] = []
    for key, load in items:
        while load > _EPS * max(1.0, capacity) and index < len(bins):
            room = capacity - bins[index].load
            if room <= _EPS * capacity:
                index += 1
                continue
            share = min(load, room)
            bins[index].add(key, share)
            load -= share
        if load > _EPS * max(1.0, capacity):
            rest.append((key, load))
    return rest


def _max_bucket(b: _Bin, bucket_of: Mapping[str, int]) -> int:
    return max([b.bucket, *(bucket_of[k] for k in b.pieces)])


def _place_leftover(
    bins: list[_Bin], key: str, load: float, bucket_of: Mapping[str, int], capacity: float
) -> None:
    """Leftover rule: the bin with room and the highest max rank (ties: least loaded, lowest index); split."""
    while load > _EPS * max(1.0, capacity):
        open_bins = [i for i, b in enumerate(bins) if capacity - b.load > _EPS * capacity] or list(
            range(len(bins))
        )
        best = min(open_bins, key=lambda i: (-_max_bucket(bins[i], bucket_of), bins[i].load, i))
        share = (
            min(load, capacity - bins[best].load) if capacity - bins[best].load > _EPS * capacity else load
        )
        bins[best].add(key, share)
        load -= share


def _merge_small_pieces(bins: list[_Bin], loads: Mapping[str, float], min_phi: float) -> None:
    """Move every piece below min_phi of its adapter's load into that adapter's largest piece."""
    for key, total in loads.items():
        holders = [i for i, b in enumerate(bins) if key in b.pieces]
        if len(holders) < 2:
            continue
        largest = max(holders, key=lambda i: (bins[i].pieces[key], -i))
        for i in holders:
            if i != largest and bins[i].pieces[key] < min_phi * total:
                bins[largest].add(key, bins[i].pieces.pop(key))


def _assign_bins(
    bins: list[_Bin], workers: list[str], previous: Mapping[str, RoutingRow], loads: Mapping[str, float]
) -> list[int]:
    """order[i] = the worker index of bin i: the assignment with the most overlap with `previous`."""
    held: dict[str, dict[str, float]] = {w: {} for w in workers}
    for key, row in previous.items():
        for worker, weight in row:
            if worker in held:
                held[worker][key] = weight
    overlap = np.zeros((len(bins), len(workers)))
    for i, b in enumerate(bins):
        for j, worker in enumerate(workers):
            shared = [k for k in b.pieces if k in held[worker]]
            overlap[i, j] = (
                len(shared) + sum(min(b.pieces[k] / loads[k], held[worker][k]) for k in shared) / 2
            )
    cost = -overlap + 1e-9 * (1 - np.eye(len(bins), len(workers)))  # ties: bin i -> worker i
    rows, cols = linear_sum_assignment(cost)
    order = [0] * len(bins)
    for i, j in zip(rows, cols):
        order[i] = int(j)
    return order


def _rows_from_bins(
    bins: list[_Bin], order: list[int], workers: list[str], loads: Mapping[str, float]
) -> dict[str, RoutingRow]:
    shares: dict[str, list[tuple[str, float]]] = {}
    for i, b in enumerate(bins):
        for key, load in b.pieces.items():
            shares.setdefault(key, []).append((workers[order[i]], load))
    return {key: _normalised(row) for key, row in shares.items()}


def _normalised(row: list[tuple[str, float]]) -> RoutingRow:
    """((worker, weight), ...) sorted by worker, weights summing to 1 (the last takes the rounding)."""
    row = sorted(row)
    total = sum(load for _, load in row)
    weights = [load / total for _, load in row]
    weights[-1] = 1.0 - sum(weights[:-1])
    return tuple((worker, w) for (worker, _), w in zip(row, weights))


def _place_idle(
    table: dict[str, RoutingRow],
    keys: list[str],
    bucket_of: Mapping[str, int],
    workers: list[str],
    previous: Mapping[str, RoutingRow],
    bins: list[_Bin],
    order: list[int],
) -> None:
    """One holder per zero-demand adapter: its previous live holder of largest weight, else the leftover rule
    over workers (highest max rank, then least loaded, fewest adapters, id)."""
    live = set(workers)
    max_bucket = {w: 0 for w in workers}
    load = {w: 0.0 for w in workers}
    for i, b in enumerate(bins):
        worker = workers[order[i]]
        max_bucket[worker] = max(max_bucket[worker], *(bucket_of[k] for k in b.pieces), 0)
        load[worker] += b.load
    count = {w: sum(1 for row in table.values() for holder, _ in row if holder == w) for w in workers}
    for key in keys:
        holders = [(w, weight) for w, weight in previous.get(key, ()) if w in live]
        if holders:
            worker = min(holders, key=lambda h: (-h[1], h[0]))[0]
        else:
            worker = min(workers, key=lambda w: (-max_bucket[w], load[w], count[w], w))
        table[key] = ((worker, 1.0),)
        count[worker] += 1


def _worker_loads(
    table: Mapping[str, RoutingRow],
    workers: list[str],
    loads: Mapping[str, float],
    bucket_of: Mapping[str, int],
) -> tuple[WorkerLoad, ...]:
    load = {w: 0.0 for w in workers}
    max_rank = {w: 0 for w in workers}
    count = {w: 0 for w in workers}
    for key, row in table.items():
        for worker, weight in row:
            count[worker] += 1
            if key in loads:
                load[worker] += weight * loads[key]
                max_rank[worker] = max(max_rank[worker], bucket_of[key])
    return tuple(WorkerLoad(w, load[w], max_rank[w], count[w]) for w in workers)


def _moved(table: Mapping[str, RoutingRow], previous: Mapping[str, RoutingRow]) -> tuple[str, ...]:
    """Previously placed adapters that gained a holder (that worker pulls it on its first request)."""
    moved = []
    for key, row in table.items():
        before = {w for w, _ in previous.get(key, ())}
        if before and any(w not in before for w, _ in row):
            moved.append(key)
    return tuple(sorted(moved))


def _dropped(
    table: Mapping[str, RoutingRow], previous: Mapping[str, RoutingRow], workers: list[str]
) -> dict[str, tuple[str, ...]]:
    """Per live worker, the adapters in its previous rows that are no longer assigned to it."""
    live = set(workers)
    dropped: dict[str, list[str]] = {}
    for key, row in previous.items():
        now = {w for w, _ in table.get(key, ())}
        for worker, _ in row:
            if worker in live and worker not in now:
                dropped.setdefault(worker, []).append(key)
    return {w: tuple(sorted(keys)) for w, keys in sorted(dropped.items())}
