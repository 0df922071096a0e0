"""Size classes: exact 1-D K-means, a K selection that can choose fewer than Kmax, midpoint cut-offs."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.multiqueue.queue_clustering import (
    QueueLayout,
    fit_queue_layout,
    midpoints,
    optimal_kmeans_1d,
    select_num_clusters,
)


def brute_force_wcss(values: list[float], k: int) -> float:
    """Minimal WCSS over every split of the sorted values into k contiguous runs."""
    ordered = sorted(values)
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(ordered)), k - 1):
        bounds = [0, *cuts, len(ordered)]
        total = 0.0
        for a, b in itertools.pairwise(bounds):
            run = ordered[a:b]
            mean = sum(run) / len(run)
            total += sum((x - mean) ** 2 for x in run)
        best = min(best, total)
    return best


def blobs(centers: list[float], num_per_center: int, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(c, spread) for c in centers for _ in range(num_per_center)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=10), st.integers(1, 4))
def test_kmeans_is_exact_against_brute_force(values: list[float], max_k: int) -> None:
    wcss, centroids = optimal_kmeans_1d(values, max_k)
    assert len(wcss) == min(max_k, len(set(values)))
    for k, (w, c) in enumerate(zip(wcss, centroids, strict=True), start=1):
        assert w == pytest.approx(brute_force_wcss(values, k), abs=1e-9)
        assert len(c) == k and c == sorted(c)


@pytest.mark.parametrize(
    "centers",
    [[0.5], [0.2, 0.8], [0.1, 0.5, 0.9], [0.1, 0.35, 0.6, 0.85], [0.05, 0.3, 0.32 + 0.6, 2.0]],
    ids=["one", "two", "three", "four-evenly-spaced", "four-uneven"],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_selection_finds_the_true_number_of_separable_clusters(centers: list[float], seed: int) -> None:
    values = blobs(centers, num_per_center=60, spread=0.015, seed=seed)
    layout = fit_queue_layout(values, max_queues=4)
    assert layout.num_queues == len(centers)
    for found, true in zip(layout.centroids, sorted(centers), strict=True):
        assert found == pytest.approx(true, abs=0.01)


@pytest.mark.parametrize(
    "draw",
    [
        lambda r: r.random(),
        lambda r: r.gauss(0, 1),
        lambda r: r.lognormvariate(0, 1),
        lambda r: r.expovariate(1),
    ],
    ids=["uniform", "gauss", "lognormal", "exponential"],
)
def test_one_smooth_distribution_is_one_cluster(draw: object) -> None:
    rng = random.Random(7)
    values = [draw(rng) for _ in range(500)]  # type: ignore[operator]
    wcss, _ = optimal_kmeans_1d(values, 4)
    assert wcss[3] < wcss[0] / 4  # minimal WCSS alone would have chosen 4
    assert fit_queue_layout(values, max_queues=4).num_queues == 1


def test_never_more_than_kmax_even_with_more_true_clusters() -> None:
    values = blobs([0.1, 0.3, 0.5, 0.7, 0.9, 1.1], num_per_center=40, spread=0.01, seed=3)
    assert fit_queue_layout(values, max_queues=4).num_queues <= 4
    assert fit_queue_layout(values, max_queues=2).num_queues <= 2
    assert fit_queue_layout(values, max_queues=6).num_queues == 6


def test_no_more_clusters_than_distinct_values() -> None:
    assert fit_queue_layout([0.3] * 20 + [0.9] * 20, max_queues=4).centroids == pytest.approx((0.3, 0.9))
    assert fit_queue_layout([0.5] * 10, max_queues=4).num_queues == 1


def test_selection_takes_the_largest_k_with_a_real_split() -> None:
    # rho_2 = (0.2/1) / (1/2)^2 = 0.8 (at a coarse look one smooth run); rho_3 = (0.1/0.2) / (2/3)^2 = 1.1;
    # rho_4 = (0.01/0.1) / (3/4)^2 = 0.18 < 0.5: the groups only separate at K = 4
    assert select_num_clusters([1.0, 0.2, 0.1, 0.01]) == 4
    assert select_num_clusters([1.0, 0.2, 0.1, 0.01], max_split_ratio=0.1) == 1
    assert select_num_clusters([1.0, 0.1, 0.09, 0.08]) == 2  # rho_2 = 0.4; then no real split
    assert select_num_clusters([1.0, 0.0]) == 2
    assert select_num_clusters([1.0]) == 1


def test_cutoffs_are_midpoints_between_sorted_centroids() -> None:
    assert midpoints([0.9, 0.1, 0.5]) == pytest.approx((0.3, 0.7))
    values = blobs([0.1, 0.5, 0.9], num_per_center=30, spread=0.01, seed=5)
    layout = fit_queue_layout(values, max_queues=4)
    c = layout.centroids
    assert layout.cutoffs == pytest.approx(((c[0] + c[1]) / 2, (c[1] + c[2]) / 2))


def test_queue_of_uses_the_cutoffs() -> None:
    layout = QueueLayout(centroids=(0.1, 0.5, 0.9), cutoffs=(0.3, 0.7))
    assert [layout.queue_of(x) for x in (0.0, 0.29, 0.3, 0.69, 0.7, 5.0)] == [0, 0, 1, 1, 2, 2]
    assert QueueLayout().queue_of(123.0) == 0 and QueueLayout().num_queues == 1


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        optimal_kmeans_1d([], 4)
    with pytest.raises(ValueError, match="max_k"):
        optimal_kmeans_1d([1.0], 0)
