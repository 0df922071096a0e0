"""The multi-queue batch policy under sustained load (hypothesis): no queue starves, charges equal the needs of
admitted unfinished requests, quotas never admit more than the pool holds."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission.admission import WaitingRequest
from scheduler.multiqueue.multiqueue import MultiQueuePolicy
from tests.scheduler.multiqueue.test_multiqueue import BLOCK_SIZE, BYTES_PER_BLOCK, budget, wr

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
