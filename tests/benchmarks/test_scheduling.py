"""The scheduling benchmark's pure parts: workload determinism and per-adapter length distributions, the
predictor never seeing true lengths, size classes, options, the replay stopping requests at their true
length, priming the batch policy. The metrics are in test_scheduling_metrics.py. No engine speed is
asserted."""

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

pytestmark = pytest.mark.slow  # runs the scheduling benchmark end to end

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
