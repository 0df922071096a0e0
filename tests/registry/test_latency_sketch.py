import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.latency_sketch import (
    MAX_EXACT_VALUES,
    MIN_POSITIVE_MS,
    RELATIVE_ACCURACY,
    LatencySketch,
    bucket_index,
    bucket_value,
)

latencies = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
pcts = st.sampled_from([0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0])


def _sketch(values: list[float]) -> LatencySketch:
    sketch = LatencySketch()
    for value in values:
        sketch.add(value)
    return sketch


def test_empty_sketch_has_no_percentile() -> None:
    assert LatencySketch().percentile(50) is None


@given(st.lists(latencies, min_size=1, max_size=MAX_EXACT_VALUES), pcts)
def test_small_sketch_is_numpy_exactly(values: list[float], pct: float) -> None:
    sketch = _sketch(values)
    assert sketch.is_exact
    assert sketch.percentile(pct) == float(np.percentile(values, pct))


@settings(max_examples=60)
@given(st.lists(latencies, min_size=MAX_EXACT_VALUES + 1, max_size=3 * MAX_EXACT_VALUES), pcts)
def test_large_sketch_is_within_its_relative_accuracy_of_numpy(values: list[float], pct: float) -> None:
    sketch = _sketch(values)
    assert not sketch.is_exact and sketch.num_values == len(values)
    exact = float(np.percentile(values, pct))
    tolerance = RELATIVE_ACCURACY * (1 + 1e-9) * exact + MIN_POSITIVE_MS
    assert sketch.percentile(pct) == pytest.approx(exact, rel=0, abs=tolerance)


@given(st.floats(min_value=MIN_POSITIVE_MS * 1.0001, max_value=1e9))
def test_a_bucket_answers_within_the_relative_accuracy_of_its_values(value: float) -> None:
    answer = bucket_value(bucket_index(value))
    assert abs(answer - value) <= RELATIVE_ACCURACY * (1 + 1e-9) * value


def test_memory_is_one_counter_per_bucket_between_extremes_not_per_value() -> None:
    sketch = LatencySketch()
    rng = np.random.default_rng(7)
    for value in rng.lognormal(mean=5, sigma=1, size=200_000):
        sketch.add(float(value))
    assert sketch.num_values == 200_000
    assert sketch.percentile(99) == pytest.approx(np.exp(5 + 2.326 * 1), rel=0.05)
    # lognormal(5, 1) over 200,000 draws spans ~e^0.5 .. e^9.5: ~900 buckets of 1% width, each an 8-byte counter
    assert 500 < sketch.num_buckets < 1_500


def test_values_added_out_of_order_extend_the_buckets_both_ways() -> None:
    values = [100.0] * (MAX_EXACT_VALUES + 1) + [0.5, 50_000.0, 0.0]
    sketch = _sketch(values)
    assert sketch.percentile(0) == 0.0
    assert sketch.percentile(100) == pytest.approx(50_000.0, rel=RELATIVE_ACCURACY)
    assert sketch.percentile(50) == pytest.approx(100.0, rel=RELATIVE_ACCURACY)
