"""A meter of n choices (api/request_meter.py): TPOT per choice, and no length-predictor sample in its row."""

from __future__ import annotations

import pytest

from api.request_meter import RequestMeter


def meter(num_choices: int, num_delivered: int) -> RequestMeter:
    m = RequestMeter(tenant_id="t", num_prompt_tokens=7, num_choices=num_choices, predicted_output_tokens=5)
    m.max_tokens, m.is_chat, m.has_stop = 8, False, False
    m.num_delivered_tokens = num_delivered
    m.started_s, m.first_token_s, m.last_token_s = 0.0, 1.0, 5.0
    return m


@pytest.mark.parametrize(("num_choices", "tpot_ms"), [(1, 4000 / 9), (2, 4000 / 4), (5, 4000.0), (10, None)])
def test_tpot_is_per_choice(num_choices: int, tpot_ms: float | None) -> None:
    _, tpot, _ = meter(num_choices, 10).latencies_ms(6.0)
    assert tpot == (pytest.approx(tpot_ms) if tpot_ms is not None else None)


def test_a_row_of_n_choices_bills_all_tokens_but_records_no_length_sample() -> None:
    values = meter(3, 12).usage_values("ok", None)
    assert (values["prompt_tokens"], values["completion_tokens"]) == (7, 12)
    assert values["predicted_output_tokens"] is None and values["max_tokens"] is None
    single = meter(1, 4).usage_values("ok", None)
    assert (single["predicted_output_tokens"], single["max_tokens"]) == (5, 8)
    assert meter(3, 0).open_values("api")["predicted_output_tokens"] is None
