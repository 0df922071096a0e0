"""Admission policies (FIFO, SJF): pure data in, order out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.admission.admission import BatchBudget, WaitingRequest
from scheduler.admission.batch_policy import FifoPolicy, SjfPolicy, make_batch_policy
from settings import Settings

BUDGET = BatchBudget(num_free_seqs=8, num_free_tokens=4096, num_free_blocks=100, block_size=16)


def req(request_id: str, arrival: float) -> WaitingRequest:
    return WaitingRequest(request_id=request_id, arrival_time=arrival, num_prompt_tokens=10, max_tokens=5)


def test_fifo_orders_by_arrival_and_blocks_head_of_line() -> None:
    plan = FifoPolicy().plan([req("b", 2.0), req("a", 1.0), req("c", 3.0)], BUDGET)
    assert plan.request_ids == ("a", "b", "c")
    assert plan.is_head_of_line_blocking


def test_fifo_admits_nothing_without_budget() -> None:
    budget = BatchBudget(num_free_seqs=0, num_free_tokens=10, num_free_blocks=1, block_size=16)
    assert FifoPolicy().plan([req("a", 1.0)], budget).request_ids == ()


@given(st.lists(st.floats(0, 1e6, allow_nan=False), max_size=30))
def test_fifo_plan_is_a_permutation_sorted_by_arrival(arrivals: list[float]) -> None:
    waiting = [req(f"r{i}", t) for i, t in enumerate(arrivals)]
    plan = FifoPolicy().plan(waiting, BUDGET)
    assert sorted(plan.request_ids) == sorted(r.request_id for r in waiting)
    times = {r.request_id: r.arrival_time for r in waiting}
    assert [times[i] for i in plan.request_ids] == sorted(arrivals)


def test_sjf_orders_by_predicted_output_then_arrival_and_skips_what_does_not_fit() -> None:
    def predicted(request_id: str, arrival: float, tokens: int | None) -> WaitingRequest:
        return WaitingRequest(
            request_id, arrival, num_prompt_tokens=10, max_tokens=50, predicted_output_tokens=tokens
        )

    waiting = [
        predicted("long", 1.0, 40),
        predicted("short", 3.0, 5),
        predicted("tie", 2.0, 5),
        predicted("none", 0.5, None),
    ]
    plan = SjfPolicy().plan(waiting, BUDGET)
    assert plan.request_ids == ("tie", "short", "long", "none")  # no prediction counts as max_tokens (50)
    assert not plan.is_head_of_line_blocking
    assert make_batch_policy("sjf").plan(waiting, BUDGET) == plan


def test_unknown_batch_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="fifo, multiqueue, sjf"):
        Settings(engine_batch_policy="lifo")
    assert Settings(engine_batch_policy="sjf").engine.batch_policy == "sjf"
    assert Settings(engine_batch_policy="multiqueue").engine.batch_policy == "multiqueue"
