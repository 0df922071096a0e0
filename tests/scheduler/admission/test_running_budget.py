"""The running batch's token bound: off by default, an empty batch always admits, else tokens within it."""

from __future__ import annotations

import pytest

from scheduler.admission.running_budget import RunningBudget


def test_no_bound_admits_whatever_the_batch_holds() -> None:
    assert RunningBudget().may_admit(num_running_tokens=10**9, num_request_tokens=10**6, num_running=500)


def test_bound_admits_while_running_tokens_plus_the_prompt_stay_within_it() -> None:
    budget = RunningBudget(max_running_tokens=100)
    assert budget.may_admit(num_running_tokens=60, num_request_tokens=40, num_running=3)
    assert not budget.may_admit(num_running_tokens=60, num_request_tokens=41, num_running=3)


def test_an_empty_batch_admits_a_request_larger_than_the_bound() -> None:
    assert RunningBudget(max_running_tokens=8).may_admit(0, 500, num_running=0)


@pytest.mark.parametrize("bad", [0, -5])
def test_a_bound_that_is_not_positive_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="max_running_tokens"):
        RunningBudget(max_running_tokens=bad)


def test_no_adapter_bound_admits_any_adapter() -> None:
    assert RunningBudget().may_add_adapter(10**12, 10**12, num_running_adapters=40)


def test_adapter_bound_admits_while_running_adapter_bytes_plus_the_new_one_stay_within_it() -> None:
    budget = RunningBudget(max_running_adapter_bytes=300)
    assert budget.may_add_adapter(200, 100, num_running_adapters=2)
    assert not budget.may_add_adapter(200, 101, num_running_adapters=2)


def test_a_batch_running_no_adapter_admits_one_larger_than_the_bound() -> None:
    assert RunningBudget(max_running_adapter_bytes=10).may_add_adapter(0, 500, num_running_adapters=0)


@pytest.mark.parametrize("bad", [0, -1])
def test_an_adapter_bound_that_is_not_positive_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="max_running_adapter_bytes"):
        RunningBudget(max_running_adapter_bytes=bad)
