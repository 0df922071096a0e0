"""The running batch's token bound through the real BatchScheduler: with it, requests wait where the batch
policy orders them, so the policy decides who runs first; without it (the default) they all join the batch."""

from __future__ import annotations

from scheduler.admission.admission import BatchPolicy
from scheduler.admission.batch_policy import FifoPolicy, SjfPolicy
from scheduler.core.adapter_residency import AdapterResidency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from scheduler.multiqueue.multiqueue import MultiQueuePolicy
from tests.scheduler.core.scheduler_helpers import BLOCK_SIZE, PAGE_BYTES, ManualClock
from tests.scheduler.core.test_multiqueue_scheduler import drain, run_step, seq, warm_up


def bounded_scheduler(
    policy: BatchPolicy, clock: ManualClock, max_running_tokens: int | None, num_kv_pages: int = 100
) -> BatchScheduler:
    pool = PagePool(num_kv_pages, BLOCK_SIZE)
    residency = AdapterResidency(pool, PAGE_BYTES, clock=clock)
    return BatchScheduler(pool, residency, policy, 8, 64, clock=clock, max_running_tokens=max_running_tokens)


def admission_order(policy: BatchPolicy, max_running_tokens: int | None) -> list[str]:
    """ "first" runs alone (11 tokens after its first step); then "long" (predicted 20 output tokens) and a
    later "short" (predicted 2) arrive, 12 prompt tokens each: under a bound of 24 only one of them fits."""
    clock = ManualClock()
    scheduler = bounded_scheduler(policy, clock, max_running_tokens)
    admitted: list[str] = []
    scheduler.add(seq("first", 10, 6, None, clock.now, predicted=6))
    run_step(scheduler, clock, admitted)
    scheduler.add(seq("long", 12, 20, None, clock.now, predicted=20))
    scheduler.add(seq("short", 12, 2, None, clock.now + 0.1, predicted=2))
    drain(scheduler, clock, admitted)
    return admitted


def test_under_the_bound_the_order_policy_decides_which_request_runs_first() -> None:
    assert admission_order(FifoPolicy(), max_running_tokens=24) == ["first", "long", "short"]
    assert admission_order(SjfPolicy(), max_running_tokens=24) == ["first", "short", "long"]


def test_without_the_bound_both_join_the_batch_whatever_the_policy() -> None:
    assert (
        admission_order(FifoPolicy(), None)
        == admission_order(SjfPolicy(), None)
        == ["first", "long", "short"]
    )


def test_bound_keeps_the_running_tokens_within_it_once_a_request_runs() -> None:
    clock = ManualClock()
    scheduler = bounded_scheduler(FifoPolicy(), clock, max_running_tokens=30)
    for i in range(6):
        scheduler.add(seq(f"r{i}", 8, 3, None, float(i)))
    for _ in range(40):
        before = {s.request_id: s.num_tokens for s in scheduler.running}
        run_step(scheduler, clock, [])
        joined = [s for s in scheduler.running if s.request_id not in before]
        if before and joined:  # admissions into a non-empty batch kept its tokens within the bound
            assert sum(before.values()) + sum(s.num_prompt_tokens for s in joined) <= 30
    assert not scheduler.has_unfinished()


def multiqueue_vs_fifo_order(policy: BatchPolicy, max_running_tokens: int | None) -> list[str]:
    """After a warm-up with two size classes, "long1" runs; "long2" then "short" arrive."""
    clock = ManualClock()
    scheduler = bounded_scheduler(policy, clock, max_running_tokens, num_kv_pages=400)
    warm_up(scheduler, clock)
    admitted: list[str] = []
    scheduler.add(seq("long1", 40, 60, None, clock.now))
    run_step(scheduler, clock, admitted)
    scheduler.add(seq("long2", 40, 60, None, clock.now))
    scheduler.add(seq("short", 2, 2, None, clock.now + 0.1))
    drain(scheduler, clock, admitted)
    return admitted


def test_under_the_bound_multiqueue_lets_a_short_request_past_a_blocked_long_one_and_fifo_does_not() -> None:
    def multiqueue() -> MultiQueuePolicy:
        return MultiQueuePolicy(min_samples=4, window_size=4, refresh_s=1e9)

    assert multiqueue_vs_fifo_order(FifoPolicy(), max_running_tokens=60) == ["long1", "long2", "short"]
    assert multiqueue_vs_fifo_order(multiqueue(), max_running_tokens=60) == ["long1", "short", "long2"]
    # without the bound (a roomy pool) both policies let every request in at once
    assert multiqueue_vs_fifo_order(multiqueue(), None) == multiqueue_vs_fifo_order(FifoPolicy(), None)
