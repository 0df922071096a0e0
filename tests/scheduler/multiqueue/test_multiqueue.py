"""The multi-queue batch policy: classes from the window, quotas, charge once, refresh, no starvation."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.admission.admission import BatchBudget, WaitingRequest
from scheduler.admission.batch_policy import FifoPolicy, make_batch_policy
from scheduler.multiqueue.multiqueue import MultiQueuePolicy
from scheduler.multiqueue.queue_quotas import QueueLoad, split_quotas

BLOCK_SIZE = 16
BYTES_PER_BLOCK = 1000


def wr(
    request_id: str,
    arrival: float,
    prompt: int,
    output: int,
    adapter_bytes: int = 0,
    residency: str = "device",
) -> WaitingRequest:
    return WaitingRequest(
        request_id=request_id,
        arrival_time=arrival,
        num_prompt_tokens=prompt,
        max_tokens=output * 2,
        predicted_output_tokens=output,
        adapter_id=f"adapter-{adapter_bytes}" if adapter_bytes else None,
        adapter_num_bytes=adapter_bytes,
        adapter_residency=residency if adapter_bytes else "none",
    )


def budget(now: float, num_total_blocks: int = 100, max_num_seqs: int = 0) -> BatchBudget:
    return BatchBudget(
        num_free_seqs=64,
        num_free_tokens=4096,
        num_free_blocks=num_total_blocks,
        block_size=BLOCK_SIZE,
        now=now,
        num_total_blocks=num_total_blocks,
        num_bytes_per_block=BYTES_PER_BLOCK,
        max_num_seqs=max_num_seqs,
    )


def test_until_enough_samples_one_queue_holds_the_whole_capacity_in_fifo_order() -> None:
    policy = MultiQueuePolicy(min_samples=5)
    waiting = [wr("b", 2.0, 10, 10), wr("a", 1.0, 500, 500), wr("c", 3.0, 10, 10)]
    plan = policy.plan(waiting, budget(now=3.0))
    assert policy.num_queues == 1 and policy.quota_tokens == (100 * BLOCK_SIZE,)
    assert (
        plan.request_ids == ("a", "b", "c") and plan.group_ids == (0, 0, 0) and plan.is_head_of_line_blocking
    )


def test_quota_stops_a_busy_queue_in_fifo_order() -> None:
    policy = MultiQueuePolicy(min_samples=100)
    policy.plan([wr("r1", 0.0, 600, 400)], budget(now=0.0))
    policy.on_admitted("r1", now=0.0)  # 1000 of 1600 tokens charged
    plan = policy.plan([wr("r2", 1.0, 400, 400), wr("r3", 2.0, 50, 50)], budget(now=2.0))
    assert plan.request_ids == ()  # r2 (800) does not fit the 600 left, r3 waits behind it (FIFO)
    policy.on_finished("r1", now=3.0)
    assert policy.plan([wr("r2", 1.0, 400, 400), wr("r3", 2.0, 50, 50)], budget(now=3.0)).request_ids == (
        "r2",
        "r3",
    )


def test_when_sequence_slots_are_scarcer_than_the_pool_quotas_count_slots() -> None:
    policy = MultiQueuePolicy(min_samples=100)
    waiting = [wr("a", 0.0, 30, 10), wr("b", 1.0, 50, 30)]  # needs 40 and 80: mean 60 tokens
    slot_bound = BatchBudget(
        num_free_seqs=2,
        num_free_tokens=4096,
        num_free_blocks=100,
        block_size=BLOCK_SIZE,
        now=1.0,
        num_total_blocks=100,
        num_bytes_per_block=BYTES_PER_BLOCK,
        max_num_seqs=2,
    )
    plan = policy.plan(waiting, slot_bound)
    assert policy.is_slot_bound and policy.quota_tokens == (2.0,)  # 2 x 60 tokens < the pool's 1600
    assert plan.request_ids == ("a", "b")
    policy.on_admitted("a", now=1.0)
    assert policy.charged_tokens() == [1.0]  # one slot, not a's 40 tokens
    roomy = BatchBudget(
        num_free_seqs=2,
        num_free_tokens=4096,
        num_free_blocks=100,
        block_size=BLOCK_SIZE,
        now=1.0,
        num_total_blocks=100,
        num_bytes_per_block=BYTES_PER_BLOCK,
        max_num_seqs=64,
    )
    policy.plan(waiting[1:], roomy)
    assert not policy.is_slot_bound and policy.quota_tokens == (100.0 * BLOCK_SIZE,)  # 64 x 60 > 1600
    assert policy.charged_tokens() == [40.0]  # the same admission, now counted in tokens


def test_need_counts_prompt_predicted_output_and_a_non_resident_adapters_blocks_in_a_unified_pool() -> None:
    policy = MultiQueuePolicy()
    waiting = [
        wr("cold", 0.0, 30, 20, adapter_bytes=2500, residency="host"),
        wr("warm", 0.0, 30, 20, adapter_bytes=2500, residency="device"),
    ]
    policy.plan(waiting, budget(now=0.0))
    assert policy.need_tokens("cold") == 30 + 20 + 3 * BLOCK_SIZE  # 2500 bytes: 3 blocks of 1000
    assert policy.need_tokens("warm") == 30 + 20  # its pages are already taken, charged by nobody


def test_static_adapter_share_charges_no_adapter_tokens_against_the_kv_quota() -> None:
    policy = MultiQueuePolicy()
    static = dataclasses.replace(budget(now=0.0), is_adapter_memory_shared=False)
    policy.plan([wr("cold", 0.0, 30, 20, adapter_bytes=2500, residency="host")], static)
    assert policy.need_tokens("cold") == 30 + 20
    assert policy.quota_tokens == (100 * BLOCK_SIZE,)  # the whole KV pool


def test_charge_once_on_admission_refund_on_finish_and_no_double_charge_after_preemption() -> None:
    policy = MultiQueuePolicy()
    request = wr("r", 0.0, 40, 60)
    policy.plan([request], budget(now=0.0))
    assert policy.charged_tokens() == [0.0]  # planning charges nothing
    policy.on_admitted("r", now=0.0)
    assert policy.charged_tokens() == [100.0]
    plan = policy.plan([request], budget(now=1.0))  # preempted: back among the waiting, still charged
    assert plan.request_ids == ("r",) and policy.charged_tokens() == [100.0]
    policy.on_admitted("r", now=1.0)
    assert policy.charged_tokens() == [100.0]
    policy.on_finished("r", now=5.0)
    assert policy.charged_tokens() == [0.0] and policy.queue_of("r") is None
    policy.on_finished("r", now=6.0)  # a second finish (or an unknown id) changes nothing
    assert policy.charged_tokens() == [0.0]


def test_aborting_a_waiting_request_charges_nothing() -> None:
    policy = MultiQueuePolicy()
    policy.plan([wr("r", 0.0, 40, 60)], budget(now=0.0))
    policy.on_finished("r", now=1.0)
    assert policy.charged_tokens() == [0.0] and policy.queue_of("r") is None


def test_admitting_a_request_never_planned_is_refused() -> None:
    with pytest.raises(ValueError, match="never planned"):
        MultiQueuePolicy().on_admitted("ghost")


def small(i: int, arrival: float) -> WaitingRequest:
    return wr(f"s{i}", arrival, 10, 10)


def large(i: int, arrival: float) -> WaitingRequest:
    return wr(f"l{i}", arrival, 100, 300)


def test_refresh_builds_classes_and_mm1_quotas_from_the_window() -> None:
    policy = MultiQueuePolicy(min_samples=8, window_size=20, refresh_s=100.0, slo_s=5.0)
    first = [small(i, 0.0) for i in range(4)] + [large(i, 0.0) for i in range(4)]
    plan = policy.plan(first, budget(now=0.0))
    assert policy.num_queues == 2 and policy.num_refreshes == 1
    assert {policy.queue_of(r.request_id) for r in first[:4]} == {0}
    assert {policy.queue_of(r.request_id) for r in first[4:]} == {1}
    for request_id in plan.request_ids:
        policy.on_admitted(request_id, now=0.0)
    for r in first:
        policy.on_finished(r.request_id, now=2.0 if r.request_id.startswith("s") else 10.0)
    policy.plan([small(9, 50.0)], budget(now=50.0))
    assert policy.num_refreshes == 1  # not due before refresh_s
    policy.plan([small(9, 50.0)], budget(now=100.0))
    assert policy.num_refreshes == 2
    # window: 5 small (need 20, D 2 s), 4 large (need 400, D 10 s), arrivals over the last 100 s
    expected = split_quotas([QueueLoad(20, 2.0, 5 / 100), QueueLoad(400, 10.0, 4 / 100)], 1600, slo_s=5.0)
    assert policy.quota_tokens == pytest.approx(expected)
    # by hand: minima 20*2*(0.2+0.05) = 10 and 400*10*(0.2+0.04) = 960; 630 left split 1:16 by lambda*S
    assert expected == pytest.approx([10 + 630 / 17, 960 + 630 * 16 / 17])


def test_a_queued_request_keeps_its_queue_across_a_refresh() -> None:
    policy = MultiQueuePolicy(min_samples=4, refresh_s=1000.0)
    policy.plan([large(0, 0.0), small(0, 0.0), small(1, 0.0)], budget(now=0.0))
    assert policy.num_queues == 1
    policy.plan([large(0, 0.0), small(0, 0.0), small(1, 0.0), small(2, 1.0), large(1, 1.0)], budget(now=1.0))
    assert policy.num_queues == 2
    assert policy.queue_of("l0") == 0  # queued before the classes existed: stays
    assert policy.queue_of("l1") == 1 and policy.queue_of("s2") == 0


def test_later_small_request_goes_ahead_of_a_large_one_waiting_for_its_queues_quota() -> None:
    policy = MultiQueuePolicy(min_samples=8, window_size=8)
    first = [small(i, 0.0) for i in range(4)] + [large(i, 0.0) for i in range(4)]
    policy.plan(first, budget(now=0.0, num_total_blocks=40))  # 640 tokens; quotas by demand 80 : 1600
    assert policy.quota_tokens == pytest.approx([640 * 80 / 1680, 640 * 1600 / 1680])  # room for one large
    policy.on_admitted("l0", now=0.0)
    for request in first[:4] + first[5:]:
        policy.on_finished(request.request_id, now=0.0)  # forget the rest of the warm-up
    waiting = [large(9, 1.0), small(9, 2.0)]
    plan = policy.plan(waiting, budget(now=2.0, num_total_blocks=40))
    assert plan.request_ids == ("s9",) and plan.group_ids == (0,)  # l9 waits for l0's quota
    assert FifoPolicy().plan(waiting, budget(now=2.0)).request_ids == ("l9", "s9")


def test_make_batch_policy_passes_knobs_and_refuses_unknown_ones() -> None:
    policy = make_batch_policy("multiqueue", slo_s=1.5, refresh_s=30.0, max_queues=3)
    assert isinstance(policy, MultiQueuePolicy) and (policy.slo_s, policy.refresh_s, policy.max_queues) == (
        1.5,
        30.0,
        3,
    )
    with pytest.raises(ValueError, match="no option"):
        make_batch_policy("multiqueue", slo=1.0)
    with pytest.raises(ValueError, match="no option"):
        make_batch_policy("fifo", slo_s=1.0)
    with pytest.raises(ValueError, match="must be positive"):
        MultiQueuePolicy(slo_s=0)
    with pytest.raises(ValueError, match=">= 1"):
        MultiQueuePolicy(max_queues=0)
