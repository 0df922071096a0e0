"""Two-phase admission under token quotas and the adapter bypass, on hand-made queues."""

from __future__ import annotations

import math

import pytest

from scheduler.multiqueue.queue_admission import (
    QueuedRequest,
    RunningRequest,
    bypass_ids,
    predicted_wait_s,
    two_phase_order,
)


def q(request_id: str, charge: int, arrival: float = 0.0, **kwargs: object) -> QueuedRequest:
    return QueuedRequest(request_id, arrival, charge, **kwargs)  # type: ignore[arg-type]


def order(planned: list[tuple[QueuedRequest, int]]) -> list[tuple[str, int]]:
    return [(r.request_id, queue) for r, queue in planned]


def test_phase_one_own_quota_smallest_first_then_phase_two_from_spare() -> None:
    queues = [
        [q("a", 10), q("b", 10), q("c", 10)],  # remaining 20: a, b; c does not fit and stops q0
        [],  # empty: donates its remaining 20
        [q("d", 15), q("e", 40), q("g", 5)],  # remaining 30: d; e does not fit (g behind it waits)
        [q("f", 5), q("h", 4)],  # remaining 8: f; h does not fit; not empty, so no donation
    ]
    planned = two_phase_order(queues, quota_tokens=[25, 30, 50, 10], charged_tokens=[5, 10, 20, 2])
    # phase 2 (spare 20): c (10 left), e does not fit so q2 gets nothing more (not even g), h (6 left)
    assert order(planned) == [("a", 0), ("b", 0), ("d", 2), ("f", 3), ("c", 0), ("h", 3)]


def test_a_queue_emptied_in_phase_one_donates_what_is_left() -> None:
    queues = [[q("s1", 5), q("s2", 5)], [q("l1", 50), q("l2", 50)]]
    planned = two_phase_order(queues, quota_tokens=[40, 60], charged_tokens=[1, 10])
    # q0 empties with 29 left (donated); q1: l1 fits its 50, l2 needs 50 > 29 spare
    assert order(planned) == [("s1", 0), ("s2", 0), ("l1", 1)]
    planned = two_phase_order(queues, quota_tokens=[80, 60], charged_tokens=[1, 10])
    assert order(planned) == [("s1", 0), ("s2", 0), ("l1", 1), ("l2", 1)]  # 69 spare covers l2


def test_idle_queue_head_goes_first_even_when_larger_than_its_quota() -> None:
    queues = [[q("x", 5, arrival=3.0)], [q("big", 500, arrival=1.0), q("y", 10, arrival=2.0)]]
    planned = two_phase_order(queues, quota_tokens=[100, 100], charged_tokens=[0, 0])
    # both queues idle: their heads first, oldest first; q0 then empties and donates 95, which covers y
    assert order(planned) == [("big", 1), ("x", 0), ("y", 1)]


def test_busy_queue_head_larger_than_what_is_left_waits() -> None:
    queues = [[q("x", 5)], [q("big", 500), q("y", 10)]]
    planned = two_phase_order(queues, quota_tokens=[100, 100], charged_tokens=[0, 1])
    assert order(planned) == [("x", 0)]  # big waits for q1's running request; y waits behind it (FIFO)


def test_nothing_charged_and_one_queue_admits_a_request_larger_than_the_whole_capacity() -> None:
    planned = two_phase_order([[q("huge", 10_000), q("next", 1)]], quota_tokens=[640], charged_tokens=[0])
    assert order(planned) == [("huge", 0)]


def test_already_charged_request_costs_no_quota() -> None:
    queues = [[q("preempted", 0), q("new", 10)]]
    planned = two_phase_order(queues, quota_tokens=[50], charged_tokens=[50])  # quota used up
    assert order(planned) == [("preempted", 0)]


def test_preempted_request_is_readmitted_even_when_its_queue_is_overdrawn() -> None:
    # its queue holds a 500-token charge against a quota of 100 (admitted by the progress rule)
    planned = two_phase_order([[q("preempted", 0), q("next", 10)]], quota_tokens=[100], charged_tokens=[500])
    assert order(planned) == [("preempted", 0)]


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="one entry per queue"):
        two_phase_order([[]], quota_tokens=[1, 2], charged_tokens=[0])


def test_predicted_wait_is_when_finishing_requests_return_the_adapters_tokens() -> None:
    running = [RunningRequest(10.0, 100), RunningRequest(2.0, 32), RunningRequest(3.0, 48)]
    assert predicted_wait_s(64, running) == 3.0  # 32 at 2 s, 80 at 3 s
    assert predicted_wait_s(32, running) == 2.0
    assert predicted_wait_s(1000, running) == 10.0  # never enough: all of them finished
    assert predicted_wait_s(16, []) == math.inf


def test_bypass_only_ready_later_requests_of_the_blocked_queue_that_run_shorter_than_the_wait() -> None:
    running = [RunningRequest(2.0, 32), RunningRequest(3.0, 48), RunningRequest(10.0, 100)]
    planned = [
        (q("early", 8, predicted_run_s=0.1), 0),  # before the head: nothing to bypass
        (q("head", 8, adapter_tokens=64, is_adapter_ready=False), 0),  # predicted wait 3 s
        (q("short", 8, predicted_run_s=1.0), 0),
        (q("cold", 8, adapter_tokens=500, is_adapter_ready=False, predicted_run_s=0.1), 0),
        (q("long", 8, predicted_run_s=5.0), 0),
        (q("other-queue", 8, predicted_run_s=0.1), 1),
    ]
    assert bypass_ids(planned, running) == frozenset({"short"})
    assert bypass_ids(planned, []) == frozenset(
        {"short", "long"}
    )  # nothing running: the head's wait is unbounded
