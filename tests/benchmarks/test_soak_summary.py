"""benchmarks/soak.py's summary helpers: the latency of each period of a soak."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from soak import latency_by_period


def test_latency_by_period_is_the_median_of_each_period_in_order() -> None:
    sent = [(100.0, 0.2), (150.0, 0.4), (299.0, 0.3), (400.0, 1.0), (401.0, 3.0), (1000.0, 0.5)]
    # periods of 300 s from the first request: [100, 400) -> 0.3; [400, 700) -> 2.0; none in [700, 1000)
    assert latency_by_period(sent, 300.0) == [0.3, 2.0, None, 0.5]


def test_latency_by_period_of_no_requests_is_empty() -> None:
    assert latency_by_period([], 300.0) == []
