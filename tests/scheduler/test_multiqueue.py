"""The multi-queue batch policy: classes from the window, quotas, charge once, refresh, no starvation."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission import BatchBudget, WaitingRequest
from scheduler.batch_policy import FifoPolicy, make_batch_policy
from scheduler.multiqueue import MultiQueuePolicy
from scheduler.queue_quotas import QueueLoad, split_quotas

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


# ---- no starvation under sustained load (property) -----------------------------------------------------

MAX_DURATION = 6  # every admitted request finishes within this many steps


@dataclass
class Simulation:
    """Drives the policy as the engine would: finishes, arrivals, one plan per step, admits the whole plan."""

    policy: MultiQueuePolicy
    num_total_blocks: int
    rng: random.Random
    max_num_seqs: int = 0  # > 0: quotas may count sequence slots (when they bind before KV tokens)
    waiting: dict[str, WaitingRequest] = field(default_factory=dict)
    finish_step: dict[str, int] = field(default_factory=dict)
    gap: dict[int, int] = field(
        default_factory=dict
    )  # queue -> consecutive non-empty steps without admission
    is_shrunk_in_gap: dict[int, bool] = field(default_factory=dict)
    max_gap: int = 0
    num_admitted: int = 0

    def step(self, step: int, arrivals: list[tuple[int, int, int]]) -> None:
        for request_id in [r for r, s in self.finish_step.items() if s == step]:
            del self.finish_step[request_id]
            self.policy.on_finished(request_id, now=float(step))
        for i, (prompt, output, adapter_bytes) in enumerate(arrivals):
            request_id = f"r{step}-{i}"
            self.waiting[request_id] = wr(request_id, float(step), prompt, output, adapter_bytes)
        num_queues_before = self.policy.num_queues
        plan = self.policy.plan(
            list(self.waiting.values()), budget(float(step), self.num_total_blocks, self.max_num_seqs)
        )
        is_shrunk = self.policy.num_queues < num_queues_before
        non_empty = {self.policy.queue_of(r) for r in self.waiting}
        for request_id in plan.request_ids:
            self.policy.on_admitted(request_id, now=float(step))
            del self.waiting[request_id]
            self.finish_step[request_id] = step + self.rng.randint(1, MAX_DURATION)
            self.num_admitted += 1
        self.check_gaps(non_empty, set(plan.group_ids), is_shrunk)

    def check_gaps(self, non_empty: set[int | None], admitting: set[int], is_shrunk: bool) -> None:
        """A non-empty queue admits within MAX_DURATION - 1 steps: by then everything charged to it when it
        last admitted has finished, so it is idle and its head goes first. A refresh that merges queues in the
        middle of a gap may hand it requests admitted under another index: one more MAX_DURATION then."""
        for queue in range(max(self.policy.num_queues, max(self.gap, default=0) + 1)):
            if queue in non_empty and queue not in admitting:
                if is_shrunk and self.gap.get(queue, 0) > 0:
                    self.is_shrunk_in_gap[queue] = True
                self.gap[queue] = self.gap.get(queue, 0) + 1
                bound = 2 * MAX_DURATION - 1 if self.is_shrunk_in_gap.get(queue) else MAX_DURATION - 1
                assert self.gap[queue] <= bound, (queue, self.gap[queue])
                self.max_gap = max(self.max_gap, self.gap[queue])
            else:
                self.gap[queue], self.is_shrunk_in_gap[queue] = 0, False


request_shapes = st.tuples(
    st.integers(1, 300), st.integers(1, 500), st.sampled_from([0, 0, 2_000, 16_000, 64_000])
)


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(st.lists(request_shapes, max_size=4), min_size=20, max_size=80),
    num_total_blocks=st.integers(4, 120),
    max_queues=st.integers(1, 4),
    max_num_seqs=st.sampled_from([0, 1, 2, 4, 8]),
    seed=st.integers(0, 2**16),
)
def test_every_non_empty_queue_admits_within_a_bounded_number_of_steps(
    arrivals: list[list[tuple[int, int, int]]],
    num_total_blocks: int,
    max_queues: int,
    max_num_seqs: int,
    seed: int,
) -> None:
    policy = MultiQueuePolicy(max_queues=max_queues, min_samples=8, window_size=40, refresh_s=7.0, slo_s=2.0)
    sim = Simulation(policy, num_total_blocks, random.Random(seed), max_num_seqs)
    num_arrived = sum(len(a) for a in arrivals)
    for step, step_arrivals in enumerate(arrivals):
        sim.step(step, step_arrivals)
    step = len(arrivals)
    while sim.waiting or sim.finish_step:  # drain: the load stops, every request completes
        sim.step(step, [])
        step += 1
        assert step < len(arrivals) + 10 * num_arrived * MAX_DURATION + 10
    assert sim.num_admitted == num_arrived
    assert policy.charged_tokens() == [0.0] * policy.num_queues


# ---- charge accounting under admissions, preemptions and aborts (property) -------------------------------


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["arrive", "plan", "preempt", "finish"]), st.integers(0, 10**6), request_shapes
        ),
        min_size=1,
        max_size=120,
    )
)
def test_charges_equal_the_needs_of_admitted_unfinished_requests(
    ops: list[tuple[str, int, tuple[int, int, int]]],
) -> None:
    policy = MultiQueuePolicy(min_samples=6, window_size=30, refresh_s=3.0)
    waiting: dict[str, WaitingRequest] = {}
    running: set[str] = set()
    needs: dict[str, int] = {}  # request id -> need, once admitted (until finished)
    for now, (op, pick, shape) in enumerate(ops):
        if op == "arrive":
            waiting[f"r{now}"] = wr(f"r{now}", float(now), *shape)
        elif op == "plan" and waiting:
            plan = policy.plan(list(waiting.values()), budget(float(now), num_total_blocks=30))
            for request_id in plan.request_ids[: pick % (len(plan.request_ids) + 1)]:
                needs.setdefault(request_id, policy.need_tokens(request_id))  # type: ignore[arg-type]
                policy.on_admitted(request_id, now=float(now))
                running.add(request_id)
                del waiting[request_id]
        elif op == "preempt" and running:
            request_id = sorted(running)[pick % len(running)]
            running.remove(request_id)
            waiting[request_id] = wr(request_id, 0.0, *shape)  # shape is irrelevant: first sight fixed it
        elif op == "finish" and (running or waiting):
            request_id = sorted(running | set(waiting))[pick % len(running | set(waiting))]
            running.discard(request_id)
            waiting.pop(request_id, None)
            needs.pop(request_id, None)
            policy.on_finished(request_id, now=float(now))
        assert sum(policy.charged_tokens()) == sum(needs.values())


# ---- quotas against the pool, in either memory mode (property) -------------------------------------------

pool_requests = st.lists(
    st.tuples(
        st.integers(1, 200),  # prompt tokens
        st.integers(1, 200),  # predicted output tokens
        st.sampled_from([None, "a", "b", "c"]),  # adapter
        st.booleans(),  # adapter on the device when first seen
    ),
    min_size=1,
    max_size=40,
)
ADAPTER_BYTES = {"a": 2500, "b": 9000, "c": 30000}


@settings(max_examples=80, deadline=None)
@given(
    reqs=pool_requests, is_unified=st.booleans(), num_blocks=st.integers(30, 120), rounds=st.integers(1, 4)
)
def test_quotas_never_admit_more_than_the_pool_holds_in_either_memory_mode(
    reqs: list[tuple[int, int, str | None, bool]], is_unified: bool, num_blocks: int, rounds: int
) -> None:
    """Admitting every planned request (nothing finishes) never needs more KV pool than there is, beyond the
    progress rule's single head: unified, KV tokens plus the non-resident adapters' pages; static, KV tokens
    only (adapters live in their own share)."""
    pool_tokens = num_blocks * BLOCK_SIZE
    policy = MultiQueuePolicy(min_samples=10**6)  # one queue: its quota is the whole pool
    pool_budget = dataclasses.replace(
        budget(now=0.0, num_total_blocks=num_blocks), is_adapter_memory_shared=is_unified
    )
    waiting = [
        wr(f"r{i}", float(i), p, o, ADAPTER_BYTES[a] if a else 0, "device" if resident else "host")
        for i, (p, o, a, resident) in enumerate(reqs)
    ]
    admitted: list[WaitingRequest] = []
    for round_index in range(rounds):
        batch = waiting[round_index::rounds]
        for request_id in policy.plan(batch, pool_budget).request_ids:
            policy.on_admitted(request_id, now=0.0)
            admitted.append(next(r for r in batch if r.request_id == request_id))
    assert policy.quota_tokens == (float(pool_tokens),)
    kv_tokens = sum(r.num_prompt_tokens + r.num_predicted_output_tokens for r in admitted)
    cold_adapters = {r.adapter_id: r.adapter_num_bytes for r in admitted if r.adapter_residency == "host"}
    adapter_tokens = (
        sum(-(-b // BYTES_PER_BLOCK) * BLOCK_SIZE for b in cold_adapters.values()) if is_unified else 0
    )
    assert kv_tokens + adapter_tokens <= pool_tokens or len(admitted) == 1
