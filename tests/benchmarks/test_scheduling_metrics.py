"""The scheduling benchmark's metrics (benchmarks/scheduling_metrics.py): queueing shares per size class, the
SLO-throughput interpolation, the highest finished load, the summary against FIFO and S-LoRA. No engine
speed is asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from scheduling_metrics import (
    compare_with,
    drain_limit_s,
    highest_finished,
    queueing_by_class,
    report_text,
    run_metrics,
    summarize_systems,
    throughput_at_slo,
)

# ---- metrics ----------------------------------------------------------------------------------------


def record(
    index: int, arrival: float, scheduled: float | None, finish: float | None, reason: str = "length"
) -> dict:
    return {
        "index": index,
        "arrival": arrival,
        "first_scheduled": scheduled,
        "finish": finish,
        "finish_reason": reason,
    }


def test_queueing_share_is_a_ratio_of_sums_over_completed_requests_per_class() -> None:
    records = [
        record(0, 0.0, 1.0, 2.0),  # small: queued 1 of 2 s
        record(1, 0.0, 0.0, 8.0),  # small: queued 0 of 8 s
        record(2, 1.0, 4.0, 5.0),  # large: queued 3 of 4 s
        record(3, 0.0, None, None, reason=None),  # large, never finished: left out
        record(4, 0.0, 1.0, 3.0, reason="abort"),  # medium, aborted: left out
    ]
    class_of = {0: "small", 1: "small", 2: "large", 3: "large", 4: "medium"}
    by_class = queueing_by_class(records, class_of)
    assert by_class["small"]["queueing_share"] == 0.1 and by_class["small"]["num_completed"] == 2
    assert by_class["small"]["queueing_ms_mean"] == 500.0
    assert by_class["large"]["queueing_share"] == 0.75
    assert by_class["medium"] == {
        "num_completed": 0,
        "queueing_share": None,
        "queueing_ms_mean": None,
        "e2e_ms_mean": None,
    }


def test_a_failed_child_is_an_unfinished_point() -> None:
    point = run_metrics({"error": "timeout", "log": "x.log"}, {})
    assert point["is_finished"] is False and point["error"] == "timeout"


def test_drain_limit_is_a_share_of_the_arrival_span_with_a_floor() -> None:
    assert drain_limit_s(100.0, 0.25, 5.0) == 25.0
    assert drain_limit_s(8.0, 0.25, 5.0) == 5.0
    with pytest.raises(ValueError):
        drain_limit_s(10.0, -1.0, 5.0)


def pt(rate: float, p99: float | None, is_finished: bool = True, load: float | None = None, **extra) -> dict:
    return {
        "rate_rps": rate,
        "load": rate if load is None else load,
        "ttft_ms_p99": p99,
        "is_finished": is_finished,
        **extra,
    }


def test_slo_throughput_interpolates_between_the_last_passing_and_first_failing_rate() -> None:
    points = [pt(1.0, 100.0), pt(2.0, 300.0), pt(3.0, 900.0)]
    assert throughput_at_slo(points, 200.0) == {"rps": 1.5, "status": "interpolated"}
    assert throughput_at_slo(list(reversed(points)), 200.0)["rps"] == 1.5  # order does not matter
    assert throughput_at_slo(points, 100.0) == {"rps": 1.0, "status": "interpolated"}


def test_slo_throughput_edge_cases() -> None:
    assert throughput_at_slo([pt(1.0, 100.0), pt(2.0, 150.0, is_finished=False)], 200.0) == {
        "rps": 1.0,
        "status": "last_passing",  # an unfinished point has no P99 to interpolate to
    }
    assert throughput_at_slo([pt(1.0, 300.0), pt(2.0, 100.0)], 200.0) == {"rps": None, "status": "none_pass"}
    assert throughput_at_slo([pt(1.0, 100.0), pt(2.0, 150.0)], 200.0) == {"rps": 2.0, "status": "all_pass"}
    # a later point that passes again after a failure does not count (first crossing)
    assert throughput_at_slo([pt(1.0, 100.0), pt(2.0, 300.0), pt(3.0, 150.0)], 200.0)["rps"] == 1.5
    assert throughput_at_slo([], 200.0)["status"] == "no_points"


def test_highest_finished_stops_at_the_first_unfinished_load() -> None:
    points = [pt(1.0, 1.0), pt(2.0, 1.0), pt(3.0, 1.0, is_finished=False), pt(4.0, 1.0)]
    assert highest_finished(points)["rate_rps"] == 2.0
    assert highest_finished([pt(1.0, 1.0, is_finished=False)]) is None


def shares(small: float, large: float) -> dict:
    return {
        "small": {"queueing_share": small},
        "medium": {"queueing_share": None},
        "large": {"queueing_share": large},
    }


def test_comparison_with_fifo_is_taken_at_fifos_highest_finished_load() -> None:
    fifo = [pt(1.0, 100.0), pt(2.0, 1000.0), pt(3.0, 5000.0, is_finished=False)]
    mine = [pt(1.0, 90.0), pt(2.0, 150.0, queueing_by_class=shares(0.05, 0.2)), pt(3.0, 400.0)]
    vs = compare_with(mine, fifo, slo_ms=500.0)
    assert vs["at_load"] == 2.0 and vs["p99_ttft_reduction"] == 0.85
    assert vs["slo_throughput_rps"] == 3.0 and vs["baseline_slo_throughput_rps"] == pytest.approx(
        1.4444, abs=1e-4
    )
    assert vs["slo_throughput_ratio"] == pytest.approx(2.077, abs=1e-3)
    assert vs["max_queueing_share"] == 0.2 and vs["queueing_share_by_class"]["medium"] is None


def test_summary_checks_chameleons_targets_against_fifo_with_the_same_cache_and_against_slora() -> None:
    fifo = [
        pt(1.0, 100.0, queueing_by_class=shares(0.3, 0.1)),
        pt(2.0, 2000.0, queueing_by_class=shares(0.4, 0.2)),
    ]
    mq = [
        pt(1.0, 50.0, queueing_by_class=shares(0.05, 0.02)),
        pt(2.0, 150.0, queueing_by_class=shares(0.08, 0.09)),
    ]
    by_system = {"fifo/cache": fifo, "mq/cache": mq, "fifo/no-cache": fifo}
    summary = summarize_systems(by_system, ["fifo", "mq", "absent"], [True, False], slo_ms=500.0)
    entry = summary["systems"]["mq/cache"]
    vs = entry["vs_fifo_same_cache"]
    assert vs["p99_ttft_reduction"] == 0.925 and vs["meets_p99_ttft_target"] is True
    assert vs["slo_throughput_ratio"] == pytest.approx(2.0 / (1 + 400 / 1900), abs=1e-3)
    assert vs["meets_slo_throughput_target"] is True and vs["meets_queueing_target"] is True
    assert entry["vs_fifo_no_cache"]["p99_ttft_reduction"] == 0.925
    assert summary["systems"]["fifo/cache"]["vs_fifo_same_cache"]["meets_p99_ttft_target"] is False
    assert "vs_fifo_no_cache" not in summary["systems"]["fifo/no-cache"]
    assert set(summary["systems"]) == {
        "fifo/cache",
        "mq/cache",
        "fifo/no-cache",
    }  # absent systems are left out
    report = {
        "predictor": {"num_train": 8, "held_out": {}, "workload": {"mae": 1.0}},
        "calibration": {
            "system": "fifo/cache",
            "unloaded_ttft_ms_mean": 10,
            "capacity_rps": 2,
            "slo_ttft_ms": 50,
        },
        "workload": {},
        "engine_common": {},
        "skipped_policies": ["multiqueue"],
        "summary": summary,
        "points": [{**p, "system": s} for s, ps in by_system.items() for p in ps],
        "config": {"out": "x.json"},
        "wall_s": 1.0,
    }
    text = report_text(report)
    assert "mq/cache" in text and "skipped (not in BATCH_POLICIES): multiqueue" in text
