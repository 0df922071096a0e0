import json
import random

import pytest

from scheduler.routing.perf_model import (
    DEFAULT_PERF_MODEL,
    LatencySample,
    LinearLatency,
    PerfModel,
    fit_latency,
    fit_load,
    rank_term,
)

RANKS = (0, 8, 16, 64, 128)


def _decode_batches(seed: int, count: int = 60) -> list[tuple[tuple[int, int], ...]]:
    rng = random.Random(seed)
    return [tuple((1, rng.choice(RANKS)) for _ in range(rng.randint(1, 12))) for _ in range(count)]


def _prefill_batches(seed: int, count: int = 60) -> list[tuple[tuple[int, int], ...]]:
    rng = random.Random(seed)
    return [
        tuple((rng.choice((8, 32, 128)), rng.choice(RANKS)) for _ in range(rng.randint(1, 6)))
        for _ in range(count)
    ]


def _samples(model: LinearLatency, batches, noise_ms: float = 0.0, seed: int = 0) -> list[LatencySample]:
    rng = random.Random(seed)
    return [LatencySample(b, model.predict_ms(b) + rng.gauss(0, noise_ms)) for b in batches]


def test_rank_terms_match_caraserve_forms() -> None:
    decode = [(1, 8), (1, 64), (1, 0)]
    assert rank_term(decode, "sum") == 72  # sum of ranks (MBGMV)
    assert rank_term(decode, "max") == 3 * 64  # |S| x max rank (BGMV)
    prefill = [(10, 8), (30, 16)]
    assert rank_term(prefill, "sum") == 10 * 8 + 30 * 16
    assert rank_term(prefill, "max") == 40 * 16
    assert rank_term([], "max") == 0


@pytest.mark.parametrize("form", ["sum", "max"])
def test_decode_fit_recovers_coefficients_and_picks_the_rank_form(form: str) -> None:
    truth = LinearLatency(intercept_ms=12.0, per_unit_ms=1.5, per_rank_ms=0.02, rank_form=form)  # type: ignore[arg-type]
    fitted = fit_latency(_samples(truth, _decode_batches(1)), per_token=False)
    assert fitted.rank_form == form
    assert fitted.intercept_ms == pytest.approx(12.0, rel=1e-6)
    assert fitted.per_unit_ms == pytest.approx(1.5, rel=1e-6)
    assert fitted.per_rank_ms == pytest.approx(0.02, rel=1e-6)
    assert fitted.r2 == pytest.approx(1.0)
    assert fitted.other_r2 is not None and fitted.other_r2 < 1.0
    assert fitted.num_samples == 60


@pytest.mark.parametrize("form", ["sum", "max"])
def test_prefill_fit_with_noise_picks_the_rank_form(form: str) -> None:
    truth = LinearLatency(
        intercept_ms=20.0, per_unit_ms=0.3, per_rank_ms=0.004, rank_form=form, per_token=True
    )  # type: ignore[arg-type]
    fitted = fit_latency(_samples(truth, _prefill_batches(2, 200), noise_ms=1.0), per_token=True)
    assert fitted.rank_form == form
    assert fitted.per_token
    assert fitted.per_unit_ms == pytest.approx(0.3, rel=0.1)
    assert fitted.per_rank_ms == pytest.approx(0.004, rel=0.15)
    assert fitted.r2 > 0.95


def test_negative_slopes_are_dropped() -> None:
    # latency falls with the rank term in this data: the rank slope is clamped to 0, the rest refit
    samples = [LatencySample(((1, r),) * n, 10.0 + n - 0.001 * r * n) for n in (1, 2, 4) for r in (8, 64)]
    fitted = fit_latency(samples, per_token=False)
    assert fitted.per_rank_ms == 0.0
    assert fitted.per_unit_ms > 0


def test_single_rank_profile_is_a_tie_that_keeps_sum() -> None:
    truth = LinearLatency(intercept_ms=5.0, per_unit_ms=1.0, per_rank_ms=0.01)
    fitted = fit_latency(_samples(truth, [((1, 16),) * n for n in range(1, 9)]), per_token=False)
    assert fitted.rank_form == "sum"
    assert fitted.predict_ms([(1, 16)] * 3) == pytest.approx(truth.predict_ms([(1, 16)] * 3))


def test_fit_needs_three_samples() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        fit_latency([LatencySample(((1, 8),), 1.0)] * 2, per_token=False)


def test_empty_batch_costs_nothing() -> None:
    assert DEFAULT_PERF_MODEL.decode_ms([]) == 0.0
    assert DEFAULT_PERF_MODEL.prefill_ms([]) == 0.0
    assert DEFAULT_PERF_MODEL.decode_ms([8]) > 0


def test_load_fit_recovers_line() -> None:
    load = fit_load([(8, 3.0 + 0.1 * 8), (64, 3.0 + 0.1 * 64), (128, 3.0 + 0.1 * 128)])
    assert load.intercept_ms == pytest.approx(3.0)
    assert load.per_rank_ms == pytest.approx(0.1)


def test_profile_round_trips_through_json() -> None:
    truth = LinearLatency(intercept_ms=12.0, per_unit_ms=1.5, per_rank_ms=0.02, rank_form="max")
    model = PerfModel(
        prefill=fit_latency(
            _samples(LinearLatency(1.0, 0.1, 0.001, per_token=True), _prefill_batches(3)), per_token=True
        ),
        decode=fit_latency(_samples(truth, _decode_batches(4)), per_token=False),
        load=fit_load([(8, 1.0), (64, 2.0)]),
        meta={"device": "cpu"},
    )
    again = PerfModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again == model
    assert again.decode.rank_form == "max"
    assert again.prefill.per_token and not again.decode.per_token


def test_malformed_profile_is_refused_with_a_message() -> None:
    with pytest.raises(ValueError, match="not a lorahost performance profile"):
        PerfModel.from_dict({"prefill": {}})
    with pytest.raises(ValueError, match="version"):
        PerfModel.from_dict({**DEFAULT_PERF_MODEL.to_dict(), "version": 99})
    with pytest.raises(ValueError, match="rank_form"):
        PerfModel.from_dict(
            {
                **DEFAULT_PERF_MODEL.to_dict(),
                "decode": {**DEFAULT_PERF_MODEL.decode.to_dict(), "rank_form": "avg"},
            }
        )
