"""Releasing requests to an external engine (scheduler/admission/external_release.py): never past its sequence or LoRA
limits, in the policy's order, and a FIFO head that waits for a LoRA slot is never passed."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.admission.admission import AdmissionPlan, WaitingRequest
from scheduler.admission.external_release import ReleaseLimits, release_now


def _waiting(adapters: list[str | None]) -> dict[str, WaitingRequest]:
    return {f"r{i}": WaitingRequest(f"r{i}", float(i), 10, 10, adapter_id=a) for i, a in enumerate(adapters)}


def _plan(waiting: dict[str, WaitingRequest], hol: bool = True) -> AdmissionPlan:
    return AdmissionPlan(tuple(waiting), is_head_of_line_blocking=hol)


def test_fifo_stops_at_the_first_request_without_a_lora_slot() -> None:
    waiting = _waiting(["a", "b", "c", "a", None])
    released = release_now(_plan(waiting), waiting, {}, ReleaseLimits(max_num_seqs=8, max_loras=2))
    # r2 needs a third slot: it waits, and so does everything after it (r3 of "a" too)
    assert released == ["r0", "r1"]


def test_without_head_of_line_blocking_a_request_without_a_slot_is_skipped() -> None:
    waiting = _waiting(["a", "b", "c", "a", None])
    plan = _plan(waiting, hol=False)
    released = release_now(plan, waiting, {}, ReleaseLimits(max_num_seqs=8, max_loras=2))
    assert released == ["r0", "r1", "r3", "r4"]


def test_adapters_already_in_flight_take_no_new_slot_and_sequences_bound_everything() -> None:
    waiting = _waiting(["a", "b", None, "a"])
    in_flight = {"a": 2, "b": 1, None: 1}
    assert release_now(_plan(waiting), waiting, in_flight, ReleaseLimits(6, 2)) == ["r0", "r1"]
    assert release_now(_plan(waiting), waiting, in_flight, ReleaseLimits(4, 2)) == []


def test_requests_gone_since_the_plan_are_left_out() -> None:
    waiting = _waiting(["a", "b"])
    plan = AdmissionPlan(("gone", *waiting))
    assert release_now(plan, waiting, {}, ReleaseLimits(4, 4)) == ["r0", "r1"]


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        ReleaseLimits(max_num_seqs=0, max_loras=1)


adapter_names = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d", "e"]))


@given(
    adapters=st.lists(adapter_names, max_size=20),
    in_flight=st.dictionaries(adapter_names, st.integers(0, 3), max_size=4),
    max_num_seqs=st.integers(1, 10),
    max_loras=st.integers(1, 4),
    hol=st.booleans(),
)
def test_never_past_the_limits_and_always_in_plan_order(
    adapters: list[str | None],
    in_flight: dict[str | None, int],
    max_num_seqs: int,
    max_loras: int,
    hol: bool,
) -> None:
    waiting = _waiting(adapters)
    plan = _plan(waiting, hol)
    limits = ReleaseLimits(max_num_seqs, max_loras)
    released = release_now(plan, waiting, in_flight, limits)
    order = list(plan.request_ids)
    assert released == sorted(released, key=order.index)
    after = Counter({a: n for a, n in in_flight.items() if n > 0})
    after.update(waiting[r].adapter_id for r in released)
    num_before = sum(in_flight.values())
    assert sum(after.values()) <= max(num_before, max_num_seqs)  # adds nothing once full
    distinct_before = {a for a, n in in_flight.items() if a is not None and n > 0}
    distinct_after = {a for a in after if a is not None}
    assert len(distinct_after) <= max(len(distinct_before), max_loras)
    if hol:  # a prefix of the plan: nothing passes a request that waits
        assert released == order[: len(released)]
    if not in_flight and waiting:  # an idle engine always takes the first request
        assert released[:1] == order[:1]
