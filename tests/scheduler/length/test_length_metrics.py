"""Length-prediction metrics for scheduling: rank correlation and per-bucket recall, hand-computed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.length.length_metrics import average_ranks, bucket_of, length_metrics, spearman

EDGES = (32, 64, 128, 256, 512, 1024)


def test_buckets_count_the_edges_at_or_below_a_length() -> None:
    assert [bucket_of(n, EDGES) for n in (0, 31, 32, 63, 64, 1023, 1024, 5000)] == [0, 0, 1, 1, 2, 5, 6, 6]


def test_ties_share_the_mean_of_their_ranks() -> None:
    assert average_ranks([100, 100, 5]) == [2.5, 2.5, 1.0]
    assert average_ranks([10, 50, 200, 30]) == [1.0, 3.0, 4.0, 2.0]


def test_spearman_by_hand() -> None:
    # ranks [1, 3, 4, 2] vs [2, 1, 3, 4]: sum d^2 = 10, rho = 1 - 6 * 10 / (4 * 15) = 0
    assert spearman([10, 50, 200, 30], [20, 5, 40, 300]) == pytest.approx(0.0, abs=1e-12)
    # with ties: ranks [2.5, 2.5, 1] vs [3, 1.5, 1.5]: cov 0.75 / sqrt(1.5 * 1.5) = 0.5
    assert spearman([100, 100, 5], [100, 50, 50]) == pytest.approx(0.5)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([5, 5, 5], [1, 2, 3]) is None  # a constant prediction orders nothing
    assert spearman([1], [1]) is None


def test_a_constant_short_prediction_scores_high_bucket_accuracy_and_tells_nothing() -> None:
    pairs = [(10, 10 + i) for i in range(9)] + [(10, 500)]  # 90% short; the long one predicted short
    metrics = length_metrics(pairs, EDGES)
    assert metrics.bucket_accuracy == pytest.approx(0.9)
    assert metrics.spearman is None
    assert metrics.bucket_recall == (1.0, None, None, None, 0.0, None, None)
    assert metrics.bucket_num_samples == (9, 0, 0, 0, 1, 0, 0)


def test_metrics_of_seven_pairs_by_hand() -> None:
    pairs = [(10, 20), (50, 5), (200, 40), (30, 300), (100, 100), (100, 50), (5, 50)]
    metrics = length_metrics(pairs, EDGES)
    assert metrics.num_samples == 7
    assert metrics.mae == pytest.approx((10 + 45 + 160 + 270 + 0 + 50 + 45) / 7)
    assert metrics.bucket_accuracy == pytest.approx(2 / 7)
    # ranks [2, 4, 7, 3, 5.5, 5.5, 1] vs [2, 1, 3, 7, 6, 4.5, 4.5]: sum dx dy 0.25, sum dx^2 = sum dy^2 = 27.5
    assert metrics.spearman == pytest.approx(1 / 110)
    assert metrics.bucket_recall == (0.5, 0.0, 1.0, None, 0.0, None, None)
    assert metrics.bucket_num_samples == (2, 3, 1, 0, 1, 0, 0)


def test_no_pairs_have_no_metrics() -> None:
    metrics = length_metrics([], EDGES)
    assert (metrics.mae, metrics.bucket_accuracy, metrics.spearman) == (None, None, None)
    assert metrics.bucket_num_samples == (0,) * 7


@given(st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 2000)), min_size=2, max_size=40))
def test_spearman_is_one_against_itself_and_bounded(pairs: list[tuple[int, int]]) -> None:
    predicted = [p for p, _ in pairs]
    rho = spearman(predicted, [t for _, t in pairs])
    assert rho is None or -1.0 <= rho <= 1.0
    if len(set(predicted)) > 1:
        assert spearman(predicted, [3 * p + 1 for p in predicted]) == pytest.approx(1.0)
