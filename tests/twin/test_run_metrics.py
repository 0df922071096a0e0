"""Run summaries of repeated runs: the median the twin is scored against, and the spread between runs."""

from __future__ import annotations

import pytest

from twin.run_metrics import COMPARED, RunSummary, compare, median_summary, spread_pct


def summary(ttft_p50_s: float, itl_p50_s: float, num_finished: int = 10) -> RunSummary:
    return RunSummary(
        num_requests=10,
        num_finished=num_finished,
        duration_s=5.0,
        throughput_tok_s=100.0,
        ttft_p50_s=ttft_p50_s,
        ttft_p99_s=2 * ttft_p50_s,
        itl_p50_s=itl_p50_s,
        itl_p99_s=2 * itl_p50_s,
        queueing_p50_s=0.0,
        queueing_p99_s=0.0,
        e2e_p50_s=1.0,
    )


def test_the_median_of_repeats_takes_each_field_on_its_own() -> None:
    runs = [summary(0.30, 0.020), summary(0.10, 0.040, 9), summary(0.20, 0.030)]
    median = median_summary(runs)
    assert (median.ttft_p50_s, median.itl_p50_s, median.ttft_p99_s) == pytest.approx((0.20, 0.030, 0.40))
    assert median.num_finished == 10 and isinstance(median.num_finished, int)
    assert median_summary([runs[1]]) == runs[1]


def test_the_spread_is_the_range_over_the_median_and_zero_for_one_run() -> None:
    runs = [summary(0.30, 0.020), summary(0.10, 0.040), summary(0.20, 0.030)]
    spread = spread_pct(runs)
    assert set(spread) == set(COMPARED)
    assert spread["ttft_p50_s"] == pytest.approx(100.0)  # (0.30 - 0.10) / 0.20
    assert spread["itl_p50_s"] == pytest.approx(200.0 / 3)  # (0.040 - 0.020) / 0.030
    assert spread["throughput_tok_s"] == 0.0 and spread["queueing_p50_s"] == 0.0  # equal; a median of 0
    assert all(v == 0.0 for v in spread_pct(runs[:1]).values())
    assert compare(median_summary(runs), runs[2])["ttft_p50_s"] == 0.0


def test_no_run_has_no_median() -> None:
    with pytest.raises(ValueError, match="no run"):
        median_summary([])
