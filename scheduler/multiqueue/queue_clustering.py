"""Size classes for the multi-queue scheduler: exact 1-D K-means over recent request sizes, a K selection
that can choose fewer than Kmax, and the cut-offs between the classes.

K-means in one dimension is solved exactly (not by Lloyd's iterations from a random start): on sorted
values every optimal cluster is a contiguous run, so dynamic programming over split points gives the
minimal within-cluster sum of squares (WCSS) for every K at once, and the optimal split point moves
monotonically with the run's end, so each K costs O(n log n) (divide and conquer; Grønlund et al. 2017,
"Fast exact k-means, k-medians and Bregman divergence clustering in 1D"). Deterministic, so the K
selection sees the true WCSS curve.

K selection: minimal WCSS always picks Kmax, and a plain elbow cannot say "one cluster". Reference: split
a structureless (uniform) run into K equal parts and its WCSS falls as 1/K^2, so going from K-1 to K
clusters multiplies WCSS by ((K-1)/K)^2 (a Gaussian run falls even more slowly). The split ratio
    rho_K = (W_K / W_{K-1}) / ((K-1)/K)^2
is ~1 (or more) when the K-th cluster only cuts a smooth run, and ~0 when it separates real groups.
The chosen K is the largest K <= Kmax with rho_K < max_split_ratio (default 0.7: the K-th cluster must
remove ~1.4x the share of WCSS that cutting uniform data would), else 1. Smooth unimodal samples (uniform,
Gaussian, log-normal, exponential; tests/scheduler/multiqueue/test_queue_clustering.py) stay at K = 1; 0.7 rather than
0.5 because a mix of a few adapter sizes times a skewed output length (benchmarks/scheduling.py's workload)
has real but overlapping classes (rho_2 ~ 0.6) that 0.5 merged into one queue, i.e. FIFO. The largest, not the
first: evenly spaced groups look uniform at a coarse K (4 groups split in 2 give rho_2 = 0.8) and only
separate at their own K. K never exceeds the number of distinct values.

Cut-offs: midpoints between consecutive sorted centroids; a size goes to the first class whose cut-off
is above it (class 0 = the smallest requests).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_MAX_SPLIT_RATIO = 0.7


@dataclass(frozen=True)
class QueueLayout:
    """Size classes: sorted centroids and the cut-offs between them (len(cutoffs) == num_queues - 1)."""

    centroids: tuple[float, ...] = (0.0,)
    cutoffs: tuple[float, ...] = ()

    @property
    def num_queues(self) -> int:
        """How many classes (queues)."""
        return len(self.cutoffs) + 1

    def queue_of(self, size: float) -> int:
        """The class of a request of `size` (0 = smallest); a size on a cut-off goes to the larger class."""
        return bisect.bisect_right(self.cutoffs, size)


class _PrefixSums:
    """O(1) sum of squared deviations of any run of the (sorted, centred) values."""

    def __init__(self, values: Sequence[float]) -> None:
        mean = sum(values) / len(values)
        self.sums = [0.0]
        self.squares = [0.0]
        for value in values:
            centred = value - mean  # centring keeps the subtraction below from cancelling
            self.sums.append(self.sums[-1] + centred)
            self.squares.append(self.squares[-1] + centred * centred)

    def cost(self, start: int, end: int) -> float:
        """WCSS of the run values[start:end] (end > start)."""
        total = self.sums[end] - self.sums[start]
        return max(0.0, self.squares[end] - self.squares[start] - total * total / (end - start))


def _next_row(prev: list[float], k: int, sums: _PrefixSums, n: int) -> tuple[list[float], list[int]]:
    """Row k of the DP: best[j] = min over i of prev[i] + cost(i, j) (k runs over the first j values)."""
    inf = float("inf")
    best = [inf] * (n + 1)
    split = [0] * (n + 1)
    # Each frame: compute best[lo..hi], knowing the optimal split lies in [opt_lo, opt_hi].
    stack = [(k, n, k - 1, n - 1)]
    while stack:
        lo, hi, opt_lo, opt_hi = stack.pop()
        if lo > hi:
            continue
        mid = (lo + hi) // 2
        best_value, best_i = inf, opt_lo
        for i in range(opt_lo, min(mid - 1, opt_hi) + 1):
            value = prev[i] + sums.cost(i, mid)
            if value < best_value:
                best_value, best_i = value, i
        best[mid], split[mid] = best_value, best_i
        stack.append((lo, mid - 1, opt_lo, best_i))
        stack.append((mid + 1, hi, best_i, opt_hi))
    return best, split


def optimal_kmeans_1d(values: Sequence[float], max_k: int) -> tuple[list[float], list[list[float]]]:
    """Exact K-means for K = 1..max_k (capped at the number of distinct values).

    Returns (wcss, centroids): wcss[K-1] is the minimal WCSS with K clusters and centroids[K-1] its sorted
    centroids. ValueError on no values or max_k < 1.
    """
    if not values:
        raise ValueError("K-means needs at least one value")
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    ordered = sorted(values)
    n = len(ordered)
    max_k = min(max_k, len(set(ordered)))
    sums = _PrefixSums(ordered)
    rows = [[0.0] + [sums.cost(0, j) for j in range(1, n + 1)]]
    splits: list[list[int]] = [[0] * (n + 1)]
    for k in range(2, max_k + 1):
        row, split = _next_row(rows[-1], k, sums, n)
        rows.append(row)
        splits.append(split)
    wcss = [row[n] for row in rows]
    centroids = [_centroids(ordered, splits, k) for k in range(1, max_k + 1)]
    return wcss, centroids


def _centroids(ordered: list[float], splits: list[list[int]], k: int) -> list[float]:
    """The means of the k runs the DP chose (walking the split points back from the end)."""
    bounds = [len(ordered)]
    for row in range(k - 1, 0, -1):
        bounds.append(splits[row][bounds[-1]])
    bounds.append(0)
    bounds.reverse()
    return [sum(ordered[a:b]) / (b - a) for a, b in itertools.pairwise(bounds)]


def select_num_clusters(wcss: Sequence[float], max_split_ratio: float = DEFAULT_MAX_SPLIT_RATIO) -> int:
    """The largest K whose split ratio rho_K is below `max_split_ratio`, else 1 (see the module doc)."""
    chosen = 1
    for k in range(2, len(wcss) + 1):
        previous = wcss[k - 2]
        if previous <= 0:
            break  # already exact: more clusters cannot help
        rho = (wcss[k - 1] / previous) / ((k - 1) / k) ** 2
        if rho < max_split_ratio:
            chosen = k
    return chosen


def midpoints(centroids: Sequence[float]) -> tuple[float, ...]:
    """Cut-offs between consecutive sorted centroids."""
    ordered = sorted(centroids)
    return tuple((a + b) / 2 for a, b in itertools.pairwise(ordered))


def fit_queue_layout(
    sizes: Sequence[float], max_queues: int, max_split_ratio: float = DEFAULT_MAX_SPLIT_RATIO
) -> QueueLayout:
    """Size classes for `sizes`: exact K-means for K = 1..max_queues, K chosen by the split ratio."""
    wcss, centroids = optimal_kmeans_1d(sizes, max_queues)
    chosen = centroids[select_num_clusters(wcss, max_split_ratio) - 1]
    return QueueLayout(centroids=tuple(chosen), cutoffs=midpoints(chosen))
