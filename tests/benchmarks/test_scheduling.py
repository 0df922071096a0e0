"""The scheduling benchmark's pure parts: workload determinism and per-adapter length distributions, the
predictor never seeing true lengths, size classes, queueing shares, the SLO-throughput interpolation, the
summary against FIFO, the replay stopping requests at their true length. No engine speed is asserted."""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import scheduling
from adapter_memory_replay import _record_output, prime_policy
from scheduling_bench import policy_overrides
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
from scheduling_workload import (
    OutputLengthModel,
    attach_lengths,
    history_samples,
    output_length_models,
    prime_requests,
    scaled_bucket_accuracy,
    size_class,
    size_cutoffs,
    synthetic_trace_rows,
    train_predictor,
    write_trace_csv,
)
from serving_workload import read_trace

ADAPTERS = [f"adapter-{i:02d}" for i in range(20)]
TRACE_GENERATED = [8, 16, 40, 120, 130, 140, 400, 420, 450, 600]  # short and long tasks, like the trace


def models(seed: int = 0) -> dict[str, OutputLengthModel]:
    return output_length_models(ADAPTERS, TRACE_GENERATED, 0.125, 64, seed)


def history(seed: int = 0, n: int = 1500) -> list:
    contexts = [random.Random(seed).randrange(50, 2000) for _ in range(n)]
    return history_samples(models(seed), ADAPTERS, 1.0, contexts, 0.125, 128, 64, seed)


# ---- workload ---------------------------------------------------------------------------------------


def test_adapter_length_models_are_seeded_and_spread_over_the_traces_lengths() -> None:
    assert models(0) == models(0) and models(0) != models(1)
    medians = [m.median for m in models(0).values()]
    assert min(medians) <= 5 and max(medians) >= 40  # some adapters short, some long
    assert all(1 <= m <= 64 for m in medians)
    assert all(0.2 <= m.sigma <= 0.8 for m in models(0).values())


def test_each_adapter_draws_around_its_own_median() -> None:
    rng = random.Random(3)
    for model in (OutputLengthModel(4.0, 0.3), OutputLengthModel(30.0, 0.5)):
        draws = [model.draw(rng, 1000) for _ in range(3000)]
        assert statistics.median(draws) == pytest.approx(model.median, rel=0.12)
    assert {OutputLengthModel(500.0, 0.8).draw(rng, 64) for _ in range(200)} <= set(range(1, 65))


def test_history_follows_the_popularity_and_each_adapters_distribution() -> None:
    samples = history()
    counts = {a: sum(s.features.adapter_id == a for s in samples) for a in ADAPTERS}
    assert counts[ADAPTERS[0]] > counts[ADAPTERS[5]] > counts[ADAPTERS[19]]  # Zipf over the given order
    model = models()[ADAPTERS[0]]
    lengths = [s.num_output_tokens for s in samples if s.features.adapter_id == ADAPTERS[0]]
    assert statistics.median(lengths) == pytest.approx(min(64.0, model.median), rel=0.2)
    assert all(s.features.max_tokens == 64 for s in samples)
    assert history() == history()  # seeded


def test_requests_carry_the_cap_and_a_prediction_that_never_sees_the_true_length() -> None:
    predictor, held_out = train_predictor(history(), seed=0)
    assert len(held_out) == 300
    base = [{"index": i, "adapter": ADAPTERS[i % 5], "prompt_tokens": 50 + i} for i in range(40)]
    a = attach_lengths(base, models(), predictor, 64, seed=0)
    b = attach_lengths(base, models(), predictor, 64, seed=1)  # other true lengths, same requests
    assert a == attach_lengths(base, models(), predictor, 64, seed=0)
    assert [r["output_tokens"] for r in a] != [r["output_tokens"] for r in b]
    assert [r["predicted_output_tokens"] for r in a] == [r["predicted_output_tokens"] for r in b]
    assert all(r["max_tokens"] == 64 and 1 <= r["predicted_output_tokens"] <= 64 for r in a)


def test_the_predictor_learns_short_and_long_adapters_apart() -> None:
    predictor, _ = train_predictor(history(), seed=0)
    by_median = sorted(models().items(), key=lambda kv: kv[1].median)
    (short, _), (long, _) = by_median[0], by_median[-1]
    base = [
        {"index": 0, "adapter": short, "prompt_tokens": 60},
        {"index": 1, "adapter": long, "prompt_tokens": 60},
    ]
    short_req, long_req = attach_lengths(base, models(), predictor, 64, seed=0)
    assert short_req["predicted_output_tokens"] < long_req["predicted_output_tokens"]


def test_scaled_bucket_accuracy_uses_edges_scaled_like_the_lengths() -> None:
    # edges 32, 64, ... x 0.125 = 4, 8, 16, ...: 5 and 7 share a class, 3 and 5 do not
    assert scaled_bucket_accuracy([(5, 7), (3, 5)], 0.125) == 0.5
    assert scaled_bucket_accuracy([(5, 7), (3, 5)], 1.0) == 1.0


def test_synthetic_trace_round_trips_through_the_trace_reader(tmp_path: Path) -> None:
    rows = synthetic_trace_rows(50, seed=0)
    path = write_trace_csv(rows, tmp_path / "trace.csv")
    back = read_trace(path)
    assert [(c, g) for _, c, g in back] == [(c, g) for _, c, g in rows]
    assert back[-1][0] == pytest.approx(rows[-1][0] - rows[0][0], abs=1e-3)
    assert 300 < statistics.median(c for _, c, _ in rows) < 3000


# ---- size classes -----------------------------------------------------------------------------------


def test_size_classes_cut_the_workload_in_tertiles() -> None:
    totals = list(range(1, 31))
    cutoffs = size_cutoffs(totals)
    classes = [size_class(t, cutoffs) for t in totals]
    assert [classes.count(c) for c in ("small", "medium", "large")] == [10, 10, 10]
    assert size_class(int(cutoffs[0]), cutoffs) == "small" and size_class(31, cutoffs) == "large"
    with pytest.raises(ValueError):
        size_cutoffs([])


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


# ---- options and the replay -------------------------------------------------------------------------


def test_unregistered_policies_are_skipped_and_loads_are_validated() -> None:
    assert scheduling.resolve_policies("sjf, nope ,fifo") == (["sjf", "fifo"], ["nope"])
    assert scheduling.parse_loads("1.5,0.3,1.5") == [0.3, 1.5]
    for bad in ("", "0,1", "a,b"):
        with pytest.raises(ValueError):
            scheduling.parse_loads(bad)


def test_quick_and_default_options() -> None:
    quick = scheduling.parse_args(["--quick"])
    assert (quick.size, quick.num_requests, quick.loads, quick.caches) == (
        "tiny",
        12,
        [0.5, 1.5],
        [True, False],
    )
    full = scheduling.parse_args([])
    assert full.loads == [0.3, 0.6, 0.8, 1.0, 1.2, 1.5] and full.policies == "fifo,sjf,multiqueue"
    assert scheduling.parse_args(["--cache", "off"]).caches == [False]
    with pytest.raises(SystemExit):
        scheduling.parse_args(["--cache", "maybe"])


class FakeEngine:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        return True


def output(num_output_tokens: int, is_finished: bool = False, reason: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        request_id="r0",
        new_token_ids=[7],
        num_output_tokens=num_output_tokens,
        is_finished=is_finished,
        finish_reason=reason,
        first_scheduled_time=100.5,
    )


def test_the_replay_stops_a_request_at_its_true_length_under_a_larger_cap() -> None:
    engine, rec = (
        FakeEngine(),
        {
            "first_scheduled": None,
            "first_token": None,
            "finish": None,
            "finish_reason": None,
            "token_times": [],
            "num_output_tokens": 0,
            "output_tokens": 2,
        },
    )
    _record_output(engine, rec, output(1), t=1.0, t0=100.0)
    assert rec["finish"] is None and rec["first_scheduled"] == 0.5 and rec["first_token"] == 1.0
    _record_output(engine, rec, output(2), t=1.2, t0=100.0)
    assert engine.aborted == ["r0"] and (rec["finish"], rec["finish_reason"]) == (1.2, "length")
    assert rec["token_times"] == [1.0, 1.2]
    engine2, rec2 = FakeEngine(), {**rec, "finish": None, "finish_reason": None, "output_tokens": 2}
    _record_output(engine2, rec2, output(2, is_finished=True, reason="length"), t=2.0, t0=100.0)
    assert engine2.aborted == [] and rec2["finish_reason"] == "length"  # the engine ended it itself


# ---- priming the batch policy -----------------------------------------------------------------------


def test_prime_requests_are_the_most_recent_history_arriving_before_the_replay() -> None:
    samples = history()
    predictor, _ = train_predictor(samples, seed=0)
    prime = prime_requests(samples, predictor, 50, seed=0)
    assert len(prime) == 50 and prime == prime_requests(samples, predictor, 50, seed=0)
    assert [r["adapter"] for r in prime] == [s.features.adapter_id for s in samples[-50:]]
    arrivals = [r["arrival_s"] for r in prime]
    assert arrivals == sorted(arrivals) and arrivals[-1] < 0
    assert all(1 <= r["predicted_output_tokens"] <= 64 and r["max_tokens"] == 64 for r in prime)
    assert prime_requests(samples, predictor, 0, seed=0) == []


class RecordingPolicy:
    def __init__(self) -> None:
        self.planned: list = []
        self.finished: list[str] = []

    def plan(self, waiting, budget):
        self.planned.append((list(waiting), budget))

    def on_finished(self, request_id: str, now: float | None = None) -> None:
        self.finished.append(request_id)


def test_priming_shows_the_history_to_the_policy_and_admits_nothing() -> None:
    policy = RecordingPolicy()
    pool = SimpleNamespace(block_size=16, num_blocks=100)
    residency = SimpleNamespace(page_bytes=4096, get=lambda name: SimpleNamespace(rank=8, num_bytes=1000))
    scheduler = SimpleNamespace(
        policy=policy, pool=pool, residency=residency, num_reclaimable_blocks=lambda: 90
    )
    engine = SimpleNamespace(scheduler=scheduler, residency=residency)
    history_ = [
        {
            "request_id": f"prime-{i}",
            "arrival_s": -2.0 + i,
            "prompt_tokens": 10,
            "max_tokens": 64,
            "adapter": "a",
            "predicted_output_tokens": 5,
        }
        for i in range(2)
    ]
    prime_policy(engine, history_, t0=1000.0)
    [(waiting, budget)] = policy.planned
    assert [w.arrival_time for w in waiting] == [998.0, 999.0]
    assert waiting[0].predicted_output_tokens == 5 and waiting[0].adapter_num_bytes == 1000
    assert budget.num_free_seqs == 0 and budget.now == 1000.0 and budget.num_total_blocks == 100
    assert policy.finished == ["prime-0", "prime-1"]
    prime_policy(engine, [], t0=1000.0)
    assert len(policy.planned) == 1


def test_multiqueue_gets_the_benchmarks_slo_unless_given() -> None:
    assert policy_overrides("multiqueue", 0.9, {}) == {"multiqueue_slo_s": 0.9}
    assert policy_overrides("multiqueue", 0.9, {"multiqueue_slo_s": 3.0}) == {}
    assert policy_overrides("fifo", 0.9, {}) == {}
