"""The multi-queue policy through the real BatchScheduler: groups, quotas and the adapter bypass, no torch."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission.admission import AdmissionPlan, BatchPolicy
from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.adapter_residency import AdapterResidency
from scheduler.core.admission_gate import AdmissionGate
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from scheduler.core.sequence import Sequence
from scheduler.core.step_plan import StepPlan
from scheduler.multiqueue.multiqueue import MultiQueuePolicy
from tests.scheduler.core.scheduler_helpers import (
    BLOCK_SIZE,
    PAGE_BYTES,
    ManualClock,
    Setup,
    adapter_sizes,
    carry_out,
    check_plan,
    make_seq,
    register_fitting_adapters,
    request_lists,
)


def make_scheduler(
    policy: BatchPolicy, num_kv_pages: int, num_adapter_pages: int, clock: ManualClock, max_num_seqs: int = 8
) -> BatchScheduler:
    pool = PagePool(num_kv_pages + num_adapter_pages, BLOCK_SIZE, num_kv_pages)
    residency = AdapterResidency(pool, PAGE_BYTES, clock=clock)
    return BatchScheduler(pool, residency, policy, max_num_seqs, 64, clock=clock)


def seq(
    request_id: str,
    num_prompt: int,
    max_tokens: int,
    adapter: str | None,
    arrival: float,
    predicted: int | None = None,
) -> Sequence:
    s = make_seq(request_id, num_prompt, max_tokens, adapter, arrival)
    s.predicted_output_tokens = predicted
    return s


def run_step(scheduler: BatchScheduler, clock: ManualClock, admitted: list[str]) -> None:
    """One step: schedule, note the admissions, carry out, advance the clock by one second."""
    before = dict(scheduler.waiting)
    carry_out(scheduler, scheduler.schedule())
    new = [s for r, s in before.items() if r not in scheduler.waiting and r not in admitted]
    admitted.extend(s.request_id for s in sorted(new, key=lambda s: s.arrival_time))
    clock.now += 1.0


def drain(scheduler: BatchScheduler, clock: ManualClock, admitted: list[str]) -> None:
    for _ in range(500):
        if not scheduler.has_unfinished():
            return
        run_step(scheduler, clock, admitted)
    raise AssertionError("requests left unfinished")


def test_admission_gate_blocks_only_the_group_and_lets_bypass_ids_past_an_adapter_blocked_head() -> None:
    grouped = AdmissionPlan(
        ("a", "b", "c", "d", "e"), True, group_ids=(0, 0, 1, 1, 1), bypass_ids=frozenset({"e"})
    )
    gate = AdmissionGate(grouped)
    gate.on_short("a", is_adapter_short=False)  # KV: the rest of group 0 waits
    assert not gate.may_try("b") and gate.may_try("c")
    gate.on_short("c", is_adapter_short=True)  # adapter: only bypass ids of group 1 pass
    assert not gate.may_try("d") and gate.may_try("e")
    gate.on_short("e", is_adapter_short=False)
    assert not gate.may_try("e") and not gate.is_closed
    fifo = AdmissionGate(AdmissionPlan(("a", "b")))
    fifo.on_short("a", is_adapter_short=True)
    assert fifo.is_closed and not fifo.may_try("b")
    sjf = AdmissionGate(AdmissionPlan(("a", "b"), is_head_of_line_blocking=False))
    sjf.on_short("a", is_adapter_short=False)
    assert not sjf.is_closed and sjf.may_try("b")


def warm_up(scheduler: BatchScheduler, clock: ManualClock) -> None:
    """Two short and two long requests: the policy's first refresh finds two size classes."""
    for i, (num_prompt, max_tokens) in enumerate([(2, 2), (40, 60), (2, 2), (40, 60)]):
        scheduler.add(seq(f"warm{i}", num_prompt, max_tokens, None, clock.now))
    drain(scheduler, clock, [])


def test_short_request_goes_ahead_of_an_earlier_long_one_whose_queue_quota_is_used_up() -> None:
    orders = {}
    for name in ("multiqueue", "fifo"):
        clock = ManualClock()
        policy = (
            MultiQueuePolicy(min_samples=4, window_size=4, refresh_s=1e9)
            if name == "multiqueue"
            else FifoPolicy()
        )
        scheduler = make_scheduler(policy, num_kv_pages=40, num_adapter_pages=0, clock=clock)  # 160 tokens
        warm_up(scheduler, clock)
        seqs = [seq("long1", 40, 60, None, clock.now), seq("long2", 40, 60, None, clock.now + 0.1)]
        for s in seqs:
            scheduler.add(s)
        admitted: list[str] = []
        run_step(scheduler, clock, admitted)
        seqs.append(short := seq("short", 2, 2, None, clock.now))
        scheduler.add(short)
        if isinstance(policy, MultiQueuePolicy):
            assert policy.num_queues == 2
            long_queue = policy.queue_of("long2")
            assert long_queue == 1 and policy.queue_of("short") is None  # not seen yet
            left = policy.quota_tokens[1] - policy.charged_tokens()[1]
            assert left < policy.need_tokens("long2")  # type: ignore[operator]  # long1 holds the long quota
        drain(scheduler, clock, admitted)
        assert all(s.is_finished and s.finish_reason == "length" for s in seqs)
        orders[name] = admitted
    assert orders["multiqueue"] == ["long1", "short", "long2"]
    assert orders["fifo"] == ["long1", "long2", "short"]  # memory allowed both long requests at once


def bypass_setup(policy: BatchPolicy) -> tuple[BatchScheduler, ManualClock, list[Sequence]]:
    """One page of adapter room, taken by "hot" (running r0); "cold" needs two pages, so it cannot load."""
    clock = ManualClock()
    scheduler = make_scheduler(policy, num_kv_pages=30, num_adapter_pages=2, clock=clock)
    scheduler.residency.register("hot", "/host/hot", rank=1, num_bytes=PAGE_BYTES)
    for name in ("cold", "cold2"):
        scheduler.residency.register(name, f"/host/{name}", rank=2, num_bytes=2 * PAGE_BYTES)
    r0 = seq("r0", 4, 20, "hot", 0.0, predicted=20)  # predicted to run 20 x 0.02 s = 0.4 s
    scheduler.add(r0)
    while r0 not in scheduler.running:  # its adapter's copy lands, then it runs
        carry_out(scheduler, scheduler.schedule())
    later = [
        seq("head", 4, 5, "cold", 1.0, predicted=5),  # its adapter cannot get device memory
        seq("hot-short", 4, 5, "hot", 2.0, predicted=5),  # adapter on the device, 0.1 s: may bypass
        seq("cold-short", 4, 5, "cold2", 3.0, predicted=5),  # adapter not on the device: may not
        seq("base-long", 4, 30, None, 4.0, predicted=30),  # no adapter but 0.6 s > the head's 0.4 s wait
    ]
    for s in later:
        scheduler.add(s)
    return scheduler, clock, [r0, *later]


def test_request_with_a_resident_adapter_bypasses_a_head_whose_adapter_cannot_fit() -> None:
    scheduler, clock, seqs = bypass_setup(MultiQueuePolicy())
    plan = scheduler.schedule()
    assert [e.seq.request_id for e in plan.entries] == ["r0", "hot-short"]
    assert set(scheduler.waiting) == {"head", "cold-short", "base-long"}
    carry_out(scheduler, plan)
    drain(scheduler, clock, [])
    assert all(s.is_finished and s.finish_reason == "length" for s in seqs)


def test_fifo_waits_behind_a_head_whose_adapter_cannot_fit() -> None:
    scheduler, _, _ = bypass_setup(FifoPolicy())
    plan = scheduler.schedule()
    assert [e.seq.request_id for e in plan.entries] == ["r0"]


setups = st.builds(
    Setup,
    num_kv_pages=st.integers(6, 24),
    num_adapter_pages=st.one_of(st.just(0), st.integers(1, 12)),
    max_num_seqs=st.integers(1, 6),
    max_num_batched_tokens=st.integers(1, 40),
)
requests = request_lists(max_arrival_step=6, max_size=16)


@settings(max_examples=80, deadline=None)
@given(setup=setups, reqs=requests, adapters=adapter_sizes, max_queues=st.integers(1, 4))
def test_multiqueue_plans_keep_the_budgets_and_every_request_finishes(
    setup: Setup,
    reqs: list[tuple[int, int, int | None, int]],
    adapters: list[tuple[int, int]],
    max_queues: int,
) -> None:
    clock = ManualClock()
    policy = MultiQueuePolicy(max_queues=max_queues, min_samples=4, window_size=12, refresh_s=3.0)
    pool = PagePool(setup.num_kv_pages + setup.num_adapter_pages, BLOCK_SIZE, setup.num_kv_pages)
    residency = AdapterResidency(pool, PAGE_BYTES, clock=clock)
    scheduler = BatchScheduler(
        pool,
        residency,
        policy,
        setup.max_num_seqs,
        setup.max_num_batched_tokens,
        num_cpu_prefill_workers=1,
        clock=clock,
    )
    register_fitting_adapters(residency, adapters, setup)
    seqs: list[Sequence] = []
    pending = sorted(enumerate(reqs), key=lambda item: item[1][3])
    for step in range(3000):
        while pending and pending[0][1][3] <= step:
            i, (num_prompt, max_tokens, adapter, _) = pending.pop(0)
            s = seq(f"r{i}", num_prompt, max_tokens, None if adapter is None else f"a{adapter}", clock.now)
            scheduler.add(s)
            seqs.append(s)
        if not pending and not scheduler.has_unfinished():
            break
        running_before = {s.request_id: s.adapter_id for s in scheduler.running if s.adapter_id is not None}
        plan = scheduler.schedule()
        check_plan(scheduler, plan, running_before, setup)
        carry_out(scheduler, plan)
        clock.now += 1.0
    assert all(s.is_finished and s.finish_reason == "length" for s in seqs)
    assert scheduler.pool.num_kv_pages == 0
    assert sum(policy.charged_tokens()) == 0


def test_static_adapter_share_is_not_charged_against_the_kv_pool() -> None:
    """engine_memory_mode=static: a big adapter lives in its own share, so three requests whose KV fits the
    pool (3 x 12 of 48 tokens) run together; charging the adapter's 60 tokens of bytes as KV tokens let one
    request in at a time and left KV blocks idle while the others waited (issue 22 item 5)."""
    clock = ManualClock()
    scheduler = make_scheduler(MultiQueuePolicy(), num_kv_pages=12, num_adapter_pages=20, clock=clock)
    scheduler.residency.register("big", "/host/big", rank=15, num_bytes=15 * PAGE_BYTES)  # 15 pages
    assert scheduler.plan_adapter_load("big", may_evict_waiting=False, plan=StepPlan())
    scheduler.on_adapter_loaded("big")
    for i in range(3):
        scheduler.add(seq(f"r{i}", 8, 4, "big", float(i), predicted=4))
    plan = scheduler.schedule()
    assert sorted(e.seq.request_id for e in plan.entries) == ["r0", "r1", "r2"]
    assert isinstance(scheduler.policy, MultiQueuePolicy)
    assert scheduler.policy.charged_tokens() == [3 * (8 + 4)]
