"""The step-cost terms shared by the router's PerfModel and the twin's CostModel (scheduler/core/step_cost.py)."""

from __future__ import annotations

from scheduler.core.step_cost import LORA_FORMS, StepCostTerms, lora_work, pick_form
from scheduler.routing.perf_model import LinearLatency, rank_term


def test_lora_work_sums_token_ranks_or_pads_to_the_largest_rank() -> None:
    entries = [(10, 8), (30, 16), (5, 0)]
    assert lora_work(entries, "sum") == 10 * 8 + 30 * 16
    assert lora_work(entries, "max") == 45 * 16  # base-model tokens count in the padded total
    assert lora_work([], "sum") == lora_work([], "max") == 0.0


def test_terms_price_tokens_sequences_and_lora_work_in_the_callers_unit() -> None:
    terms = StepCostTerms(per_token=2.0, per_seq=5.0, per_token_rank=0.5, lora_form="max")
    assert terms.token_cost(num_tokens=10, num_seqs=3) == 2.0 * 10 + 5.0 * 3
    assert terms.lora_cost([(10, 8), (30, 16)]) == 0.5 * 40 * 16
    assert StepCostTerms().lora_cost([(10, 8)]) == 0.0


def test_pick_form_keeps_the_smaller_residual_and_sum_on_a_tie() -> None:
    assert pick_form({"sum": 2.0, "max": 1.0}) == "max"
    assert pick_form({"sum": 1.0, "max": 2.0}) == "sum"
    assert pick_form({"sum": 1.0, "max": 1.0}) == "sum"
    assert LORA_FORMS == ("sum", "max")


def test_the_router_model_is_built_on_the_shared_terms() -> None:
    batch = [(10, 8), (30, 16)]
    for form in LORA_FORMS:
        assert rank_term(batch, form) == lora_work(batch, form)
    prefill = LinearLatency(
        intercept_ms=1.0, per_unit_ms=0.1, per_rank_ms=0.01, rank_form="max", per_token=True
    )
    assert prefill.terms == StepCostTerms(per_token=0.1, per_seq=0.0, per_token_rank=0.01, lora_form="max")
    assert prefill.predict_ms(batch) == 1.0 + 0.1 * 40 + 0.01 * (40 * 16)
    decode = LinearLatency(intercept_ms=1.0, per_unit_ms=0.2, per_rank_ms=0.01)
    assert decode.terms == StepCostTerms(per_token=0.0, per_seq=0.2, per_token_rank=0.01, lora_form="sum")
    assert decode.predict_ms([(1, 8), (1, 16)]) == 1.0 + 0.2 * 2 + 0.01 * 24
