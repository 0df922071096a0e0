"""The platform's multi-queue sizing ("tokens") in the policy: a held adapter is charged once, requests past
the age bound go first and hold the others back, and under random load (hypothesis) every request is admitted
exactly once and no aged request waits while the memory it needs is free."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission.admission import AdmissionPlan, BatchBudget, WaitingRequest
from scheduler.core.admission_gate import AdmissionGate
from scheduler.multiqueue.multiqueue import MultiQueuePolicy
from scheduler.multiqueue.queue_admission import QueuedRequest, two_phase_order
from scheduler.multiqueue.queue_sizing import age_bound
from tests.scheduler.multiqueue.test_multiqueue import BLOCK_SIZE, BYTES_PER_BLOCK, budget

ADAPTER_BYTES = 10 * BYTES_PER_BLOCK  # 10 blocks = 160 KV tokens


def request(
    request_id: str, arrival: float, prompt: int, output: int, adapter: str | None, residency: str = "host"
) -> WaitingRequest:
    return WaitingRequest(
        request_id=request_id,
        arrival_time=arrival,
        num_prompt_tokens=prompt,
        max_tokens=output,
        predicted_output_tokens=output,
        adapter_id=adapter,
        adapter_num_bytes=ADAPTER_BYTES if adapter else 0,
        adapter_residency=residency if adapter else "none",
    )


def test_a_held_adapter_is_charged_once_off_the_capacity_not_per_request() -> None:
    pool = 100 * BLOCK_SIZE
    policy = MultiQueuePolicy(sizing="tokens", min_samples=100)
    policy.plan([request("a1", 0.0, 50, 50, "A"), request("a2", 0.0, 50, 50, "A")], budget(0.0))
    assert policy.quota_tokens == (pool,) and policy.need_tokens("a1") == policy.need_tokens("a2") == 100
    policy.on_admitted("a1", now=0.0)
    policy.plan([request("a2", 0.0, 50, 50, "A", "device")], budget(0.1))
    assert policy.quota_tokens == (pool - 160,)  # A's 10 blocks, once
    policy.on_admitted("a2", now=0.1)
    policy.plan([request("b1", 0.2, 50, 50, "B")], budget(0.2))
    assert policy.quota_tokens == (pool - 160,)  # two requests hold A: still once
    policy.on_finished("a1", now=1.0)
    policy.on_finished("a2", now=1.0)
    policy.plan([request("b1", 0.2, 50, 50, "B")], budget(1.0))
    assert policy.quota_tokens == (pool,)
    wrs = MultiQueuePolicy(sizing="wrs", min_samples=100)
    wrs.plan([request("a1", 0.0, 50, 50, "A"), request("a2", 0.0, 50, 50, "A")], budget(0.0))
    assert wrs.need_tokens("a1") == wrs.need_tokens("a2") == 260  # the paper's rule: per request


def test_a_request_past_the_age_bound_goes_first_and_holds_back_the_others() -> None:
    policy = MultiQueuePolicy(sizing="tokens", min_samples=100, max_wait_s=1.0)
    policy.plan([request("busy", 0.0, 1200, 300, None)], budget(0.0))
    policy.on_admitted("busy", now=0.0)  # 1500 of 1600 tokens charged: no quota left for "old"
    waiting = [request("young", 0.9, 10, 10, None), request("old", 0.0, 400, 100, None)]
    before = policy.plan(waiting, budget(0.95))
    assert "old" not in before.request_ids and before.barrier_ids == frozenset()
    assert not before.is_head_of_line_blocking  # the platform's sizing skips what does not fit
    after = policy.plan(waiting, budget(1.0))
    assert after.request_ids[0] == "old" and after.barrier_ids == frozenset({"old"})
    assert after.adapter_barrier_ids == frozenset()  # its adapter shortage stops the others after 2 bounds
    assert policy.plan(waiting, budget(2.0)).adapter_barrier_ids == frozenset({"old"})


def test_the_age_bound_grows_to_half_the_oldest_wait_so_the_backlog_head_stays_in_order() -> None:
    assert age_bound(1.0, [0.2, 0.5]) == 1.0
    assert age_bound(1.0, [0.2, 8.0, 3.0]) == 4.0
    assert age_bound(None, [8.0]) is None and age_bound(1.0, []) == 1.0
    policy = MultiQueuePolicy(sizing="tokens", min_samples=100, max_wait_s=1.0)
    plan = policy.plan(
        [
            request("r0", 0.0, 10, 10, None),
            request("r5", 5.0, 10, 10, None),
            request("r7", 7.0, 10, 10, None),
        ],
        budget(10.0),
    )
    assert policy.age_bound_s == 5.0 and plan.barrier_ids == frozenset({"r0", "r5"})
    assert plan.request_ids[:2] == ("r0", "r5")


def test_the_paper_sizing_has_no_age_bound() -> None:
    policy = MultiQueuePolicy(sizing="wrs", min_samples=100)
    plan = policy.plan([request("old", 0.0, 10, 10, None)], budget(1000.0))
    assert plan.barrier_ids == frozenset() and plan.is_head_of_line_blocking


def test_aged_requests_are_planned_oldest_first_across_queues_whatever_the_quota() -> None:
    queues = [
        [QueuedRequest("s-old", 1.0, 50, is_aged=True), QueuedRequest("s-new", 5.0, 5)],
        [QueuedRequest("l-older", 0.5, 900, is_aged=True), QueuedRequest("l-new", 6.0, 900)],
    ]
    planned = two_phase_order(queues, quota_tokens=[10, 10], charged_tokens=[10, 10])
    assert [(r.request_id, g) for r, g in planned] == [("l-older", 1), ("s-old", 0)]


def test_a_barrier_short_of_kv_closes_the_plan_short_of_adapter_memory_only_when_long_aged() -> None:
    plan = AdmissionPlan(
        ("old", "older", "x"),
        is_head_of_line_blocking=False,
        group_ids=(0, 1, 0),
        barrier_ids=frozenset({"old", "older"}),
        adapter_barrier_ids=frozenset({"older"}),
    )
    gate = AdmissionGate(plan)
    gate.on_short("old", is_adapter_short=True)
    assert not gate.is_closed and gate.may_try("older")
    gate.on_short("older", is_adapter_short=True)
    assert gate.is_closed and not gate.may_try("x")
    kv = AdmissionGate(plan)
    kv.on_short("old", is_adapter_short=False)
    assert kv.is_closed


# ---- under random load (property) ------------------------------------------------------------------------


@dataclass
class MemorySim:
    """A token pool the engine admits into in plan order, with the gate's rules; adapters take the pool's
    tokens once while a running request holds them."""

    policy: MultiQueuePolicy
    num_total_blocks: int
    rng: random.Random
    waiting: dict[str, WaitingRequest] = field(default_factory=dict)
    running: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (finish step, tokens held)
    adapter_of: dict[str, str | None] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return self.num_total_blocks * BLOCK_SIZE

    def num_used(self) -> int:
        held = {self.adapter_of[r] for r in self.running} - {None}
        return sum(tokens for _, tokens in self.running.values()) + 160 * len(held)

    def cost(self, r: WaitingRequest) -> int:
        held = {self.adapter_of[x] for x in self.running}
        tokens = r.num_prompt_tokens + r.num_predicted_output_tokens
        return tokens + (160 if r.adapter_id is not None and r.adapter_id not in held else 0)

    def view(self, r: WaitingRequest) -> WaitingRequest:
        held = {self.adapter_of[x] for x in self.running}
        residency = "device" if r.adapter_id in held else "host"
        return request(
            r.request_id, r.arrival_time, r.num_prompt_tokens, r.max_tokens, r.adapter_id, residency
        )

    def step(self, now: float, arrivals: list[tuple[int, int, str | None]]) -> None:
        for rid in [rid for rid, (end, _) in self.running.items() if end <= now]:
            del self.running[rid]
            self.policy.on_finished(rid, now=now)
        for i, (prompt, output, adapter) in enumerate(arrivals):
            rid = f"r{now:g}-{i}"
            self.waiting[rid] = request(rid, now, prompt, output, adapter)
            self.adapter_of[rid] = adapter
        free_blocks = (self.capacity - self.num_used()) // BLOCK_SIZE
        plan = self.policy.plan(
            [self.view(r) for r in self.waiting.values()],
            BatchBudget(64, 4096, free_blocks, BLOCK_SIZE, now, self.num_total_blocks, BYTES_PER_BLOCK),
        )
        max_wait_at_plan = max((now - r.arrival_time for r in self.waiting.values()), default=0.0)
        gate = AdmissionGate(plan)
        for rid in plan.request_ids:
            if gate.is_closed:
                break
            if not gate.may_try(rid):
                continue
            r = self.waiting[rid]
            if self.cost(r) > self.capacity - self.num_used():
                gate.on_short(rid, is_adapter_short=False)
                continue
            assert rid not in self.admitted, f"{rid} admitted twice"
            self.admitted.append(rid)
            self.running[rid] = (int(now) + self.rng.randint(1, 5), r.num_prompt_tokens + r.max_tokens)
            del self.waiting[rid]
            self.policy.on_admitted(rid, now=now)
        self.check_no_aged_request_waits_beside_free_memory(now, max_wait_at_plan)

    def check_no_aged_request_waits_beside_free_memory(self, now: float, max_wait_at_plan: float) -> None:
        """A request past the bound still waits only if its memory is not free, or an aged request at least
        as old is waiting for memory ahead of it; the oldest request is always past the bound once it waited
        `max_wait_s` (the bound grows to half the oldest wait, never more)."""
        bound, max_wait_s = self.policy.age_bound_s, self.policy.max_wait_s
        assert bound is not None and max_wait_s is not None
        assert bound <= max(max_wait_s, max_wait_at_plan)
        free = self.capacity - self.num_used()
        aged = [r for r in self.waiting.values() if now - r.arrival_time >= bound]
        for r in aged:
            if self.cost(r) <= free:
                assert any(o.arrival_time <= r.arrival_time and self.cost(o) > free for o in aged), (now, r)


shapes = st.tuples(st.integers(1, 400), st.integers(1, 300), st.sampled_from([None, "A", "B", "C", "D"]))


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(st.lists(shapes, max_size=4), min_size=10, max_size=60),
    num_total_blocks=st.integers(60, 200),
    max_wait_s=st.sampled_from([1.0, 2.0, 4.0]),
    seed=st.integers(0, 2**16),
)
def test_every_request_is_admitted_once_and_none_past_the_bound_waits_while_its_memory_is_free(
    arrivals: list[list[tuple[int, int, str | None]]], num_total_blocks: int, max_wait_s: float, seed: int
) -> None:
    policy = MultiQueuePolicy(
        sizing="tokens", min_samples=8, window_size=40, refresh_s=7.0, max_wait_s=max_wait_s
    )
    sim = MemorySim(policy, num_total_blocks, random.Random(seed))
    for step, step_arrivals in enumerate(arrivals):
        sim.step(float(step), step_arrivals)
    step = len(arrivals)
    while sim.waiting or sim.running:
        sim.step(float(step), [])
        step += 1
        assert step < len(arrivals) + 2000, "the load stopped but requests still wait"
    num_arrived = sum(len(a) for a in arrivals)
    assert len(sim.admitted) == len(set(sim.admitted)) == num_arrived
    assert policy.charged_tokens() == [0.0] * policy.num_queues
