"""Batch scheduler of the engine core: step plans under random workloads (hypothesis), no torch.

A tiny executor stands in for the model runner (the digital twin's role): it carries out the plan's
adapter loads and advances every entry, sampling one token per sampling entry.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from collections.abc import Sequence as Sequence_
from functools import partial

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scheduler.admission.admission import AdmissionPlan, BatchBudget, WaitingRequest
from scheduler.admission.batch_policy import FifoPolicy
from scheduler.cache.eviction import EVICTION_POLICIES, make_eviction_policy
from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from scheduler.core.sequence import Sequence
from scheduler.core.waiting_view import describe_waiting
from tests.scheduler.core.scheduler_helpers import (
    BLOCK_SIZE,
    PAGE_BYTES,
    Setup,
    adapter_sizes,
    carry_out,
    check_plan,
    make_seq,
    register_fitting_adapters,
    request_lists,
)


def make_scheduler(
    setup: Setup, num_cpu_prefill_workers: int = 1, is_caching_idle_adapters: bool = True
) -> BatchScheduler:
    """num_adapter_pages 0: a unified pool of num_kv_pages; else a static split."""
    pool = PagePool(setup.num_kv_pages + setup.num_adapter_pages, BLOCK_SIZE, setup.num_kv_pages)
    # One clock for the scheduler and the residency; deterministic: every reading is one tick later.
    clock = partial(next, itertools.count())
    residency = AdapterResidency(
        pool,
        PAGE_BYTES,
        policy=make_eviction_policy(setup.eviction_policy),
        clock=clock,
        is_caching_idle_adapters=is_caching_idle_adapters,
    )
    return BatchScheduler(
        pool,
        residency,
        FifoPolicy(),
        setup.max_num_seqs,
        setup.max_num_batched_tokens,
        num_cpu_prefill_workers=num_cpu_prefill_workers,
        clock=clock,
    )


def make_resident(residency: AdapterResidency, adapter_id: str) -> None:
    """Put a registered adapter on the device (a load planned and landed)."""
    assert residency.plan_load(adapter_id, may_evict_waiting=False) == []
    residency.mark_loaded(adapter_id)


setups = st.builds(
    Setup,
    num_kv_pages=st.integers(6, 24),
    num_adapter_pages=st.one_of(st.just(0), st.integers(1, 12)),  # 0: unified pool
    max_num_seqs=st.integers(1, 6),
    max_num_batched_tokens=st.integers(1, 40),
    eviction_policy=st.sampled_from(sorted(EVICTION_POLICIES)),
)
requests = request_lists(max_arrival_step=3, max_size=14)


@settings(max_examples=200, deadline=None)
@given(setup=setups, reqs=requests, adapters=adapter_sizes)
@example(  # static split: an idle adapter on adapter-only pages while another waits for room
    setup=Setup(num_kv_pages=6, num_adapter_pages=4, max_num_seqs=1, max_num_batched_tokens=1),
    reqs=[(1, 1, 0, 0), (1, 5, 2, 0)],
    adapters=[(1, 301), (1, 1), (1, 401), (1, 1), (1, 1), (1, 1)],
)
def test_plans_keep_budgets_and_pins_and_every_request_finishes(
    setup: Setup, reqs: list[tuple[int, int, int | None, int]], adapters: list[tuple[int, int]]
) -> None:
    scheduler = make_scheduler(setup)
    residency = scheduler.residency
    register_fitting_adapters(residency, adapters, setup)
    seqs: list[Sequence] = []
    pending = list(enumerate(reqs))
    for step in range(3000):
        while pending and pending[0][1][3] <= step:  # arrivals spread over the first steps
            i, (num_prompt, max_tokens, adapter, _) = pending.pop(0)
            seq = make_seq(
                f"r{i}", num_prompt, max_tokens, None if adapter is None else f"a{adapter}", float(i)
            )
            scheduler.add(seq)
            seqs.append(seq)
        if not pending and not scheduler.has_unfinished():
            break
        running_before = {s.request_id: s.adapter_id for s in scheduler.running if s.adapter_id is not None}
        plan = scheduler.schedule()
        check_plan(scheduler, plan, running_before, setup)
        carry_out(scheduler, plan)
    assert all(s.is_finished and s.finish_reason == "length" for s in seqs)  # every request was scheduled
    assert scheduler.pool.num_kv_pages == 0
    assert all(not residency.get(f"a{i}").is_pinned for i in range(len(adapters)))  # type: ignore[union-attr]


def test_request_with_host_only_adapter_gets_a_load_and_runs_once_it_lands() -> None:
    scheduler = make_scheduler(Setup(8, 4, 4, 64), num_cpu_prefill_workers=0)  # wait for the copy
    scheduler.residency.register("cold", "/host/cold", rank=8, num_bytes=300)
    scheduler.add(make_seq("r", 5, 2, "cold", 0.0))
    plan = scheduler.schedule()
    assert [load.adapter_id for load in plan.adapter_loads] == ["cold"]
    assert plan.entries == [] and plan.copy_waits == ["r"]
    assert scheduler.residency.residency("cold") is Residency.PREPARING
    waiting = describe_waiting(make_seq("w", 3, 9, "cold", 1.0), scheduler.residency)
    assert waiting.adapter_residency == "preparing"
    scheduler.on_adapter_prepared("cold")  # the host copy is ready: the copy runs
    plan = scheduler.schedule()
    assert plan.entries == [] and plan.copy_waits == ["r"] and not plan.adapter_loads
    assert scheduler.residency.residency("cold") is Residency.COPYING
    scheduler.on_adapter_loaded("cold")
    plan = scheduler.schedule()
    assert [e.seq.request_id for e in plan.entries] == ["r"] and not plan.host_assisted_adapters
    assert (scheduler.copy_gate.num_prepare_waits, scheduler.copy_gate.num_copy_waits) == (1, 1)
    assert (scheduler.num_adapter_hits, scheduler.num_adapter_misses) == (0, 1)  # it waited for its own load


@pytest.mark.parametrize("is_caching", [True, False])
def test_without_the_adapter_cache_a_finished_requests_adapter_leaves_at_the_next_step(
    is_caching: bool,
) -> None:
    scheduler = make_scheduler(Setup(8, 4, 4, 64), is_caching_idle_adapters=is_caching)
    scheduler.residency.register("a", "/host/a", rank=4, num_bytes=100)
    scheduler.add(make_seq("r1", 4, 1, "a", 0.0))
    carry_out(scheduler, scheduler.schedule())  # loads "a" (r1 waits while its host copy is prepared)
    carry_out(scheduler, scheduler.schedule())  # prefills r1 and samples its only token
    assert scheduler.residency.residency("a") is Residency.DEVICE and not scheduler.has_unfinished()
    idle_step = scheduler.schedule()  # nothing to run; "a" is idle now
    assert idle_step.adapter_evictions == ([] if is_caching else ["a"])
    scheduler.add(make_seq("r2", 4, 1, "a", 1.0))
    plan = scheduler.schedule()
    if is_caching:  # kept while idle: r2's admission is a hit
        assert not plan.adapter_loads and (scheduler.num_adapter_hits, scheduler.num_adapter_misses) == (1, 1)
    else:  # copied again for r2, admitted once it landed: a miss
        assert [load.adapter_id for load in plan.adapter_loads] == ["a"]
        carry_out(scheduler, plan)
        carry_out(scheduler, scheduler.schedule())
        assert (scheduler.num_adapter_hits, scheduler.num_adapter_misses) == (0, 2)


def test_without_the_adapter_cache_an_adapter_a_waiting_request_uses_stays() -> None:
    scheduler = make_scheduler(Setup(8, 4, 4, 64), is_caching_idle_adapters=False)
    scheduler.residency.register("a", "/host/a", rank=4, num_bytes=100)
    scheduler.add(make_seq("r1", 4, 1, "a", 0.0))
    carry_out(scheduler, scheduler.schedule())  # loads "a"
    carry_out(scheduler, scheduler.schedule())  # runs r1 to its end
    scheduler.add(make_seq("r2", 4, 1, "a", 1.0))  # arrives before the next step
    plan = scheduler.schedule()
    assert not plan.adapter_evictions and not plan.adapter_loads and scheduler.num_adapter_hits == 1


def test_idle_adapter_is_evicted_before_one_a_waiting_request_uses() -> None:
    scheduler = make_scheduler(
        Setup(12, 0, 4, 64)
    )  # unified, 12 pages: two adapters of 5 pages fit, not three
    residency = scheduler.residency
    for name in ("idle", "queued", "new"):
        residency.register(name, f"/host/{name}", rank=5, num_bytes=5 * PAGE_BYTES)
    for name in ("idle", "queued"):
        assert residency.plan_load(name, may_evict_waiting=False) == []
        residency.mark_loaded(name)
    residency.touch("idle")  # "queued" is now the least recently used
    residency.pin("queued")  # a waiting request uses it
    assert residency.plan_load("new", may_evict_waiting=True) == ["idle"]


def test_adapter_of_running_request_blocks_a_load_that_needs_its_room() -> None:
    scheduler = make_scheduler(Setup(12, 0, 4, 64))  # unified, 12 pages: one adapter of 8 pages and r1's KV
    scheduler.residency.register("busy", "/host/busy", rank=8, num_bytes=8 * PAGE_BYTES)
    scheduler.residency.register("other", "/host/other", rank=8, num_bytes=8 * PAGE_BYTES)
    make_resident(scheduler.residency, "busy")
    scheduler.add(make_seq("r1", 4, 8, "busy", 0.0))
    scheduler.add(make_seq("r2", 4, 1, "other", 1.0))
    carry_out(scheduler, first := scheduler.schedule())
    assert [e.seq.request_id for e in first.entries] == ["r1"]  # r2 waits: r1's adapter holds the room
    second = scheduler.schedule()
    assert "busy" not in second.adapter_evictions and all(e.seq.request_id == "r1" for e in second.entries)


def test_policy_sees_predicted_output_tokens_and_adapter_bytes() -> None:
    scheduler = make_scheduler(Setup(8, 4, 4, 64))
    scheduler.residency.register("a", "/host/a", rank=4, num_bytes=250)
    seq = make_seq("r", 3, 20, "a", 0.0)
    seq.predicted_output_tokens = 5
    described = describe_waiting(seq, scheduler.residency)
    assert (described.predicted_output_tokens, described.adapter_num_bytes, described.adapter_residency) == (
        5,
        250,
        "host",
    )
    assert (
        describe_waiting(make_seq("q", 3, 20, None, 0.0), scheduler.residency).predicted_output_tokens == 20
    )


class ServedTokensRecorder(FifoPolicy):
    """FIFO that records what each step reports as served."""

    def __init__(self) -> None:
        self.served: list[dict[str, int]] = []

    def on_tokens_served(self, num_output_tokens: Mapping[str, int]) -> None:
        self.served.append(dict(num_output_tokens))


def test_policy_hears_of_each_steps_output_tokens_and_sees_the_tenant() -> None:
    """One output token per sampling entry: a prompt's last chunk and each decode, not an earlier chunk."""
    pool = PagePool(16, BLOCK_SIZE, 16)
    residency = AdapterResidency(pool, PAGE_BYTES, policy=make_eviction_policy("lru"))
    policy = ServedTokensRecorder()
    scheduler = BatchScheduler(pool, residency, policy, max_num_seqs=4, max_num_batched_tokens=6)
    long, short = make_seq("long", 10, 2, None, 0.0), make_seq("short", 2, 2, None, 1.0)
    short.tenant_id, short.tenant_weight = "t", 2.0
    assert (
        describe_waiting(short, scheduler.residency).tenant_id,
        describe_waiting(short, scheduler.residency).tenant_weight,
    ) == ("t", 2.0)
    scheduler.add(long)
    scheduler.add(short)
    while scheduler.has_unfinished():
        carry_out(scheduler, scheduler.schedule())
    # step 1: 6 of long's 10 prompt tokens; 2: its last 4 (+1 token) and short's prompt (+1); 3: two decodes
    assert policy.served == [{}, {"long": 1, "short": 1}, {"long": 1, "short": 1}]


def test_a_queued_requests_adapter_is_prefetched_and_its_admission_is_a_hit() -> None:
    scheduler = make_scheduler(Setup(8, 8, 1, 64))  # one sequence at a time
    for name in ("first", "second"):
        scheduler.residency.register(name, f"/host/{name}", rank=4, num_bytes=100)
    make_resident(scheduler.residency, "first")
    scheduler.add(make_seq("r1", 4, 2, "first", 0.0))
    scheduler.add(make_seq("r2", 4, 2, "second", 1.0))
    plan = scheduler.schedule()
    assert [e.seq.request_id for e in plan.entries] == ["r1"]
    assert [load.adapter_id for load in plan.adapter_loads] == ["second"]  # r2 waits, its adapter loads
    assert (scheduler.num_adapter_hits, scheduler.num_adapter_prefetches) == (1, 1)
    carry_out(scheduler, plan)
    while "r2" in scheduler.waiting:
        carry_out(scheduler, later := scheduler.schedule())
        assert not later.adapter_loads
    assert (scheduler.num_adapter_hits, scheduler.num_adapter_misses, scheduler.num_adapter_prefetches) == (
        2,
        0,
        1,
    )


class PlansTwoOldest(FifoPolicy):
    """Plans only the two oldest waiting requests, as a multi-queue whose quotas cover two would."""

    def plan(self, waiting: Sequence_[WaitingRequest], budget: BatchBudget) -> AdmissionPlan:
        ordered = super().plan(waiting, budget).request_ids
        return AdmissionPlan(request_ids=ordered[:2], is_head_of_line_blocking=False)


def test_a_request_the_policy_left_out_of_its_plan_still_gets_its_adapter_prefetched() -> None:
    pool = PagePool(8, BLOCK_SIZE, 8)
    residency = AdapterResidency(pool, PAGE_BYTES, policy=make_eviction_policy("lru"))
    # 4 tokens per step: r1's prompt takes them all, so the planned r2 stays waiting with r3
    scheduler = BatchScheduler(pool, residency, PlansTwoOldest(), max_num_seqs=4, max_num_batched_tokens=4)
    for name in ("first", "second", "third"):
        residency.register(name, f"/host/{name}", rank=4, num_bytes=100)
    make_resident(residency, "first")
    scheduler.add(make_seq("r1", 4, 2, "first", 0.0))
    scheduler.add(make_seq("r2", 4, 2, "second", 1.0))  # planned, not admitted (no token left)
    scheduler.add(make_seq("r3", 4, 2, "third", 2.0))  # left out of the plan
    plan = scheduler.schedule()
    assert [e.seq.request_id for e in plan.entries] == ["r1"]
    # the left-out requests' adapters load now, in queue order, so they are ready when the policy plans them
    assert [load.adapter_id for load in plan.adapter_loads] == ["second", "third"]
    assert scheduler.num_adapter_prefetches == 2


def test_a_prefetch_evicts_idle_adapters_but_never_a_running_or_queued_requests_adapter() -> None:
    scheduler = make_scheduler(Setup(8, 2, 1, 64))  # room for two adapters of one page each
    residency = scheduler.residency
    for name in ("idle", "busy", "queued", "later"):
        residency.register(name, f"/host/{name}", rank=4, num_bytes=100)
    make_resident(residency, "idle")
    make_resident(residency, "busy")
    scheduler.add(make_seq("r1", 4, 4, "busy", 0.0))
    scheduler.add(make_seq("r2", 4, 2, "queued", 1.0))
    scheduler.add(make_seq("r3", 4, 2, "later", 2.0))
    plan = scheduler.schedule()
    assert [e.seq.request_id for e in plan.entries] == ["r1"]
    assert plan.adapter_evictions == ["idle"]  # made room for r2's prefetch
    assert [load.adapter_id for load in plan.adapter_loads] == ["queued"]
    # r3's prefetch would have to evict "busy" (running) or "queued" (waiting): it is not planned.
    assert residency.residency("later") is Residency.HOST and scheduler.num_adapter_prefetches == 1


def test_no_prefetch_in_a_step_that_is_short_of_pages() -> None:
    scheduler = make_scheduler(Setup(2, 3, 4, 64))  # two KV pages: r1 takes both
    for name in ("a", "b", "c"):
        scheduler.residency.register(name, f"/host/{name}", rank=4, num_bytes=100)
    for name in ("a", "b"):
        make_resident(scheduler.residency, name)
    scheduler.add(make_seq("r1", 8, 1, "a", 0.0))
    scheduler.add(make_seq("r2", 4, 1, "b", 1.0))  # short of KV pages
    scheduler.add(make_seq("r3", 4, 1, "c", 2.0))  # behind r2 (FIFO): not tried
    plan = scheduler.schedule()
    assert [e.seq.request_id for e in plan.entries] == ["r1"] and not plan.adapter_loads
    assert "r2" in scheduler.waiting and scheduler.num_adapter_prefetches == 0
    assert scheduler.residency.residency("c") is Residency.HOST  # no prefetch in a step short of pages
