"""Output-length predictor: learns per-adapter distributions, falls back to the prior, round-trips, keeps one
history per (tenant, adapter) and sees no prompt content."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.length.length_predictor import (
    BUCKET_EDGES,
    LengthPredictor,
    LengthSample,
    PerAdapterHistory,
    RequestFeatures,
    evaluate,
    feature_row,
    length_bucket,
    linear_quantile,
    prior_predict,
)
from tests.scheduler.length.conftest import MAX_TOKENS, synthetic_samples


class ConstantPredictor(LengthPredictor):
    def __init__(self, value: int) -> None:
        super().__init__()
        self.value = value

    def predict(self, features: RequestFeatures) -> int:
        return self.value


def test_trained_predictor_beats_the_global_prior_and_the_per_adapter_median(
    fitted: LengthPredictor, split: tuple[list[LengthSample], list[LengthSample]]
) -> None:
    train, held_out = split
    global_median = int(np.median([s.num_output_tokens for s in train]))
    trained = evaluate(fitted, held_out)
    by_global_median = evaluate(ConstantPredictor(global_median), held_out)
    by_max_tokens = evaluate(LengthPredictor(), held_out)  # no model, no history: max_tokens
    per_adapter_median = LengthPredictor()
    per_adapter_median.histories = fitted.histories  # no model: the adapter's history median
    by_adapter_median = evaluate(per_adapter_median, held_out)

    assert trained["overall"]["mae"] < 0.3 * by_global_median["overall"]["mae"]
    assert trained["overall"]["mae"] < by_max_tokens["overall"]["mae"]
    assert trained["overall"]["mae"] < by_adapter_median["overall"]["mae"]
    # C's length follows its prompt: only the request features can tell
    assert trained["per_adapter"]["C"]["mae"] < 0.5 * by_adapter_median["per_adapter"]["C"]["mae"]
    assert trained["overall"]["bucket_accuracy"] > 0.7
    assert set(trained["per_adapter"]) == {"A", "B", "C"}


def test_learns_per_adapter_differences_for_the_same_request(fitted: LengthPredictor) -> None:
    a = fitted.predict(RequestFeatures("A", 300, MAX_TOKENS))
    b = fitted.predict(RequestFeatures("B", 300, MAX_TOKENS))
    short_c = fitted.predict(RequestFeatures("C", 100, MAX_TOKENS))
    long_c = fitted.predict(RequestFeatures("C", 700, MAX_TOKENS))
    assert 12 <= a <= 30
    assert 140 <= b <= 280
    assert 30 <= short_c <= 80
    assert 250 <= long_c <= 450


def test_unseen_adapter_gets_the_global_prior(fitted: LengthPredictor) -> None:
    features = RequestFeatures("never-seen", 300, MAX_TOKENS)
    unseen = fitted.predict(features)
    assert unseen == fitted.predict(RequestFeatures("another-new-one", 300, MAX_TOKENS))
    assert fitted.history(None, "never-seen") is None
    assert (
        fitted.predict(RequestFeatures("A", 300, MAX_TOKENS))
        < unseen
        < fitted.predict(RequestFeatures("B", 300, MAX_TOKENS))
    )


def test_new_adapter_history_moves_its_prediction() -> None:
    predictor = LengthPredictor(seed=0).fit(synthetic_samples(1500, seed=2))
    features = RequestFeatures("newcomer", 300, MAX_TOKENS)
    before = predictor.predict(features)
    for _ in range(10):
        predictor.observe(None, "newcomer", 20)
    after = predictor.predict(features)
    assert after < before
    assert after <= 40


def test_fast_tree_walk_matches_sklearn_predict(
    fitted: LengthPredictor, split: tuple[list[LengthSample], list[LengthSample]]
) -> None:
    rows = [feature_row(s.features, fitted.histories.get(s.features.history_key), 3) for s in split[1][:200]]
    expected = fitted.estimator.predict(np.asarray(rows))
    walked = [fitted._model.predict_one(row) for row in rows]
    np.testing.assert_allclose(walked, expected, rtol=1e-9, atol=1e-9)


def test_linear_model_kind_fits_and_round_trips(split: tuple[list[LengthSample], list[LengthSample]]) -> None:
    predictor = LengthPredictor(model_kind="linear").fit(split[0][:600])
    features = RequestFeatures("B", 300, MAX_TOKENS)
    assert 1 <= predictor.predict(features) <= MAX_TOKENS
    assert LengthPredictor.from_bytes(predictor.to_bytes()).predict(features) == predictor.predict(features)


@settings(max_examples=60, deadline=None)
@given(
    adapter=st.sampled_from(["A", "B", "C", "new", None]),
    num_prompt=st.integers(0, 100_000),
    max_tokens=st.integers(0, 4096),
    is_chat=st.booleans(),
    has_stop=st.booleans(),
)
def test_predictions_are_clipped_to_one_and_max_tokens(
    fitted: LengthPredictor,
    adapter: str | None,
    num_prompt: int,
    max_tokens: int,
    is_chat: bool,
    has_stop: bool,
) -> None:
    features = RequestFeatures(adapter, num_prompt, max_tokens, is_chat=is_chat, has_stop=has_stop)
    assert 1 <= fitted.predict(features) <= max(1, max_tokens)
    assert 1 <= prior_predict(features, fitted.history(None, adapter)) <= max(1, max_tokens)


def test_b_requests_with_a_small_cap_are_clipped(fitted: LengthPredictor) -> None:
    assert fitted.predict(RequestFeatures("B", 300, 5)) == 5


def test_prior_is_history_median_else_max_tokens() -> None:
    assert prior_predict(RequestFeatures("x", 10, 300), None) == 300
    history = PerAdapterHistory()
    for n in (10, 20, 1000):
        history.observe(n)
    assert prior_predict(RequestFeatures("x", 10, 300), history) == 20
    assert prior_predict(RequestFeatures("x", 10, 15), history) == 15


def test_history_is_bounded_with_quantiles_and_ewma() -> None:
    history = PerAdapterHistory(max_samples=4, ewma_alpha=0.5)
    for n in (100, 1, 2, 3, 4):
        history.observe(n)
    assert history.num_samples == 4
    assert history.median == 2.5  # 100 left the window
    assert history.ewma == pytest.approx(9.3125)  # 100, 50.5, 26.25, 14.625, 9.3125
    assert PerAdapterHistory().median is None


@given(
    st.lists(st.integers(0, 5000), min_size=1, max_size=60),
    st.integers(1, 20),
    st.floats(0, 1),
)
def test_history_quantiles_are_numpys_of_the_window_bit_for_bit(
    lengths: list[int], max_samples: int, q: float
) -> None:
    history = PerAdapterHistory(max_samples=max_samples)
    for i, n in enumerate(lengths):
        history.observe(n)  # the oldest leaves once the window is full
        window = np.array(lengths[: i + 1][-max_samples:], dtype=np.float64)
        assert history.quantiles() == tuple(float(v) for v in np.quantile(window, (0.1, 0.5, 0.9)))
    assert linear_quantile(sorted(lengths[-max_samples:]), q) == float(np.quantile(window, q))
    restored = PerAdapterHistory.from_state(history.to_state(), max_samples, 0.1)
    assert restored.quantiles() == history.quantiles()


def test_evaluate_reports_mae_bucket_accuracy_rank_correlation_and_recall_per_adapter() -> None:
    predictor = LengthPredictor()  # no model: history medians
    predictor.observe(None, "A", 40)
    predictor.observe(None, "B", 300)
    samples = [
        LengthSample(RequestFeatures("A", 10, 1000), 40),
        LengthSample(RequestFeatures("A", 10, 1000), 70),  # predicted 40: other bucket
        LengthSample(RequestFeatures("B", 10, 1000), 260),
    ]
    report = evaluate(predictor, samples)
    assert report["per_adapter"]["A"] == {
        "num_samples": 2,
        "mae": 15.0,
        "bucket_accuracy": 0.5,
        "spearman": None,  # one predicted length for both: no order
        "bucket_recall": [None, 1.0, 0.0, None, None, None, None],
        "bucket_num_samples": [0, 1, 1, 0, 0, 0, 0],
    }
    assert report["per_adapter"]["B"]["bucket_recall"] == [None] * 4 + [1.0, None, None]
    assert report["overall"]["mae"] == pytest.approx(70 / 3)
    assert report["overall"]["bucket_accuracy"] == pytest.approx(2 / 3)
    # ranks [1.5, 1.5, 3] vs [1, 2, 3]: 1.5 / sqrt(1.5 * 2)
    assert report["overall"]["spearman"] == pytest.approx(1.5 / 3**0.5)


def test_length_buckets_follow_the_documented_edges() -> None:
    assert [length_bucket(n) for n in (1, 31, 32, 63, 64, 1023, 1024, 10**6)] == [0, 0, 1, 1, 2, 5, 6, 6]
    assert len(BUCKET_EDGES) == 6


def test_fit_refuses_no_samples() -> None:
    with pytest.raises(ValueError, match="zero samples"):
        LengthPredictor().fit([])


# ---- isolation between tenants (issue 19) -------------------------------------------------------------------

SHARED_ADAPTERS = (None, "public")  # the base model and a public adapter: used by every tenant


@settings(max_examples=40, deadline=None)
@given(
    is_fitted=st.booleans(),
    own=st.lists(st.tuples(st.sampled_from(SHARED_ADAPTERS), st.integers(1, 512)), max_size=12),
    others=st.lists(
        st.tuples(st.sampled_from(["A", "C"]), st.sampled_from(SHARED_ADAPTERS), st.integers(1, 512)),
        max_size=60,
    ),
    num_prompt=st.integers(1, 2000),
)
def test_other_tenants_observations_never_move_a_tenants_prediction_on_a_shared_adapter(
    fitted: LengthPredictor,
    is_fitted: bool,
    own: list[tuple[str | None, int]],
    others: list[tuple[str, str | None, int]],
    num_prompt: int,
) -> None:
    def fresh() -> LengthPredictor:
        return LengthPredictor.from_bytes(fitted.to_bytes()) if is_fitted else LengthPredictor()

    alone, crowded = fresh(), fresh()
    for adapter, n in own:
        alone.observe("B", adapter, n)
    half = len(others) // 2
    for tenant, adapter, n in others[:half]:
        crowded.observe(tenant, adapter, n)
    for adapter, n in own:  # B's own observations, in the middle of the others' traffic
        crowded.observe("B", adapter, n)
    for tenant, adapter, n in others[half:]:
        crowded.observe(tenant, adapter, n)
    for adapter in SHARED_ADAPTERS:
        features = RequestFeatures(adapter, num_prompt, MAX_TOKENS, tenant_id="B")
        assert crowded.predict(features) == alone.predict(features)


def test_fit_builds_each_tenants_history_from_its_own_samples_only() -> None:
    samples = [LengthSample(RequestFeatures(None, 50, MAX_TOKENS, tenant_id="B"), 1) for _ in range(5)]
    samples += [LengthSample(RequestFeatures(None, 50, MAX_TOKENS, tenant_id="A"), 300) for _ in range(50)]
    predictor = LengthPredictor(history_dropout=0.0).fit(samples)
    assert predictor.history("B", None).to_state()[0] == [1] * 5  # type: ignore[union-attr]
    assert set(predictor.history("A", None).to_state()[0]) == {300}  # type: ignore[union-attr]


def test_request_features_hold_sizes_and_flags_only_never_prompt_content() -> None:
    from dataclasses import fields

    assert {f.name for f in fields(RequestFeatures)} == {
        "adapter_id",
        "num_prompt_tokens",
        "max_tokens",
        "is_chat",
        "has_stop",
        "tenant_id",
    }
    assert len(feature_row(RequestFeatures("A", 10, 100), None, 3)) == 10  # 4 request + 6 history features
