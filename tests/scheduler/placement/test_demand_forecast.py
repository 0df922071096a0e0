"""Demand forecast: max(EWMA over buckets, last bucket), in tokens/s."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.placement.demand_forecast import ewma, forecast_rate, forecast_rates


def test_steady_history_forecasts_its_rate() -> None:
    assert forecast_rate([600.0] * 5, 60.0) == pytest.approx(10.0)


def test_a_surge_in_the_last_bucket_is_followed_at_once() -> None:
    assert forecast_rate([0.0, 0.0, 0.0, 6000.0], 60.0) == pytest.approx(100.0)


def test_a_quiet_last_bucket_keeps_part_of_the_recent_level() -> None:
    rate = forecast_rate([6000.0, 6000.0, 6000.0, 0.0], 60.0, alpha=0.5)
    assert rate == pytest.approx(50.0)  # EWMA halves, it does not drop to 0


def test_no_history_or_zeros_forecast_zero() -> None:
    assert forecast_rate([], 60.0) == 0.0
    assert forecast_rates({"a": [0.0, 0.0]}, 60.0) == {"a": 0.0}


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        forecast_rate([1.0], 0.0)
    with pytest.raises(ValueError):
        ewma([1.0], alpha=0.0)


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=20), st.floats(0.01, 1.0))
def test_forecast_lies_between_the_last_bucket_and_the_history_max(tokens: list[float], alpha: float) -> None:
    rate = forecast_rate(tokens, 10.0, alpha) * 10.0
    assert tokens[-1] - 1e-6 <= rate <= max(tokens) * (1 + 1e-9) + 1e-6
