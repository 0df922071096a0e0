"""Fair share between tenants (scheduler/admission/fair_share.py): VTC properties under random workloads (hypothesis).

A slot-bound stand-in engine runs the policy: each step it admits the plan's first requests while sequence
slots are free, then every running request computes one output token; a request finishes after its output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission.admission import AdmissionPlan, BatchBudget, BatchPolicy, WaitingRequest
from scheduler.admission.batch_policy import FifoPolicy, SjfPolicy
from scheduler.admission.fair_share import (
    ANONYMOUS_TENANT,
    DEFAULT_OUTPUT_WEIGHT,
    DEFAULT_PROMPT_WEIGHT,
    FairSharePolicy,
)
from scheduler.multiqueue.multiqueue import MultiQueuePolicy

INNER_POLICIES = {"fifo": FifoPolicy, "sjf": SjfPolicy, "multiqueue": lambda: MultiQueuePolicy(min_samples=3)}
COMPLETE_PLANNERS = ("fifo", "sjf")  # plan every waiting request (multiqueue plans only what fits its quotas)
MAX_PROMPT = 40
MAX_OUTPUT = 8


@dataclass(frozen=True)
class Arrival:
    """One request of a workload: when (step), who, and its size."""

    step: int
    tenant: str
    num_prompt_tokens: int
    num_output_tokens: int


@dataclass
class StandInEngine:
    """Admits by the policy's plan while slots last; one output token per running request per step."""

    policy: BatchPolicy
    max_num_seqs: int
    weights: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, WaitingRequest] = field(default_factory=dict)
    remaining: dict[str, int] = field(default_factory=dict)  # running request -> output tokens left
    admitted: list[str] = field(default_factory=list)  # request ids in admission order
    finished: set[str] = field(default_factory=set)
    step_of: dict[str, int] = field(default_factory=dict)  # request id -> the step it was admitted
    num_output_tokens: dict[str, int] = field(default_factory=dict)  # request id -> its output length
    seen: set[str] = field(default_factory=set)  # requests the policy was shown (waiting at a plan call)

    def add(self, request_id: str, arrival: Arrival) -> None:
        self.waiting[request_id] = WaitingRequest(
            request_id=request_id,
            arrival_time=float(arrival.step),
            num_prompt_tokens=arrival.num_prompt_tokens,
            max_tokens=arrival.num_output_tokens,
            tenant_id=arrival.tenant,
            tenant_weight=self.weights.get(arrival.tenant, 1.0),
        )
        self.num_output_tokens[request_id] = arrival.num_output_tokens

    def step(self, step: int) -> None:
        num_free = self.max_num_seqs - len(self.remaining)
        if self.waiting and num_free > 0:
            self.seen |= set(self.waiting)
            budget = BatchBudget(
                num_free_seqs=num_free,
                num_free_tokens=10**6,
                num_free_blocks=10**6,
                block_size=16,
                now=float(step),
                num_total_blocks=10**6,
                max_num_seqs=self.max_num_seqs,
            )
            for request_id in self.policy.plan(list(self.waiting.values()), budget).request_ids[:num_free]:
                del self.waiting[request_id]
                self.policy.on_admitted(request_id, now=float(step))
                self.remaining[request_id] = self.num_output_tokens[request_id]
                self.admitted.append(request_id)
                self.step_of[request_id] = step
        self.policy.on_tokens_served(dict.fromkeys(self.remaining, 1))
        for request_id in list(self.remaining):
            self.remaining[request_id] -= 1
            if self.remaining[request_id] == 0:
                del self.remaining[request_id]
                self.finished.add(request_id)
                self.policy.on_finished(request_id, now=float(step))

    def tenants_waiting(self) -> set[str]:
        """Tenants with a waiting request the policy has been shown (it cannot act on one it has not seen)."""
        return {r.tenant_id or ANONYMOUS_TENANT for rid, r in self.waiting.items() if rid in self.seen}


def run(engine: StandInEngine, arrivals: list[Arrival], num_steps: int, check=None) -> None:
    """Feed arrivals at their steps and step the engine; `check(engine, step)` after every step."""
    pending = sorted(enumerate(arrivals), key=lambda a: a[1].step)
    for step in range(num_steps):
        while pending and pending[0][1].step <= step:
            i, arrival = pending.pop(0)
            engine.add(f"{arrival.tenant}-{i}", arrival)
        engine.step(step)
        if check is not None:
            check(engine, step)


def unfairness_bound(max_num_seqs: int, min_weight: float) -> float:
    """The module doc's bound: prompt_weight * L_p / w_min + output_weight * S * L_o / w_min."""
    return (
        DEFAULT_PROMPT_WEIGHT * MAX_PROMPT + DEFAULT_OUTPUT_WEIGHT * max_num_seqs * MAX_OUTPUT
    ) / min_weight


sizes = st.tuples(st.integers(1, MAX_PROMPT), st.integers(1, MAX_OUTPUT))


@st.composite
def two_backlogs(draw: st.DrawFn) -> list[Arrival]:
    """Tenant a floods at step 0; tenant b sends a first burst at 0 and (maybe) a second after a pause."""
    flood = [Arrival(0, "a", p, o) for p, o in draw(st.lists(sizes, min_size=20, max_size=40))]
    first = [Arrival(0, "b", p, o) for p, o in draw(st.lists(sizes, min_size=1, max_size=5))]
    comeback = draw(st.integers(0, 60))
    second = [Arrival(comeback, "b", p, o) for p, o in draw(st.lists(sizes, min_size=0, max_size=30))]
    return flood + first + second


@settings(max_examples=80, deadline=None)
@given(
    arrivals=two_backlogs(),
    max_num_seqs=st.integers(1, 6),
    inner=st.sampled_from(COMPLETE_PLANNERS),
    weight_b=st.sampled_from([1.0, 2.0, 0.5]),
)
def test_two_backlogged_tenants_counters_stay_within_the_stated_bound(
    arrivals: list[Arrival], max_num_seqs: int, inner: str, weight_b: float
) -> None:
    policy = FairSharePolicy(INNER_POLICIES[inner]())
    engine = StandInEngine(policy, max_num_seqs, weights={"a": 1.0, "b": weight_b})
    bound = unfairness_bound(max_num_seqs, min(1.0, weight_b))

    def check(engine: StandInEngine, step: int) -> None:
        # both backlogged with requests the policy has seen (it sees arrivals when a slot is free; b's comeback
        # is lifted then to a's counter, however long b had requests running and none waiting)
        if engine.tenants_waiting() == {"a", "b"}:
            assert abs(policy.counter("a") - policy.counter("b")) <= bound, step

    run(engine, arrivals, 150, check)


@settings(max_examples=100, deadline=None)
@given(
    arrivals=st.lists(
        st.builds(
            Arrival,
            st.integers(0, 30),
            st.sampled_from("abcd"),
            st.integers(1, MAX_PROMPT),
            st.integers(1, MAX_OUTPUT),
        ),
        min_size=1,
        max_size=60,
    ),
    max_num_seqs=st.integers(1, 4),
    inner=st.sampled_from(sorted(INNER_POLICIES)),
)
def test_no_request_starves_and_the_policy_forgets_finished_requests(
    arrivals: list[Arrival], max_num_seqs: int, inner: str
) -> None:
    policy = FairSharePolicy(INNER_POLICIES[inner]())
    engine = StandInEngine(policy, max_num_seqs)
    # at least one running request advances every step: all work is done within its total plus arrivals
    run(engine, arrivals, 31 + sum(a.num_output_tokens for a in arrivals))
    assert len(engine.finished) == len(arrivals)
    assert policy.active_tenants == frozenset()


@settings(max_examples=100, deadline=None)
@given(
    flood=st.lists(sizes, min_size=10, max_size=80),
    newcomer=sizes,
    arrival_step=st.integers(0, 40),
    max_num_seqs=st.integers(1, 6),
    inner=st.sampled_from(COMPLETE_PLANNERS),
)
def test_a_newly_arriving_tenant_is_admitted_within_two_admissions(
    flood: list[tuple[int, int]], newcomer: tuple[int, int], arrival_step: int, max_num_seqs: int, inner: str
) -> None:
    """However long tenant a's queue, b's request is among the next two admissions once it arrives."""
    arrivals = [Arrival(0, "a", p, o) for p, o in flood] + [Arrival(arrival_step, "b", *newcomer)]
    engine = StandInEngine(FairSharePolicy(INNER_POLICIES[inner]()), max_num_seqs)
    run(engine, arrivals, 40 + sum(o for _, o in flood) + newcomer[1])
    b_id = f"b-{len(flood)}"
    after = [rid for rid in engine.admitted if engine.step_of[rid] >= arrival_step]
    assert b_id in after[:2]


def test_a_tenant_arriving_after_another_was_served_alone_does_not_monopolise_the_engine() -> None:
    """b's counter is lifted to a's (idle time is not banked): a keeps about half of the admissions."""
    arrivals = [Arrival(0, "a", 10, 8) for _ in range(200)] + [Arrival(100, "b", 10, 8) for _ in range(50)]
    engine = StandInEngine(FairSharePolicy(FifoPolicy()), max_num_seqs=2)
    run(engine, arrivals, 200)
    after = [rid for rid in engine.admitted if engine.step_of[rid] >= 100][:20]
    assert len(after) == 20 and 8 <= sum(rid.startswith("a-") for rid in after) <= 12


waiting_lists = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", None]), st.integers(0, 20), st.integers(1, 200), st.integers(1, 50)
    ),
    min_size=1,
    max_size=30,
)


def waiting_requests(rows: list[tuple[str | None, int, int, int]]) -> list[WaitingRequest]:
    return [
        WaitingRequest(f"r{i}", float(arrival), num_prompt, max_tokens, tenant_id=tenant)
        for i, (tenant, arrival, num_prompt, max_tokens) in enumerate(rows)
    ]


BUDGET = BatchBudget(
    num_free_seqs=8,
    num_free_tokens=512,
    num_free_blocks=64,
    block_size=16,
    now=30.0,
    num_total_blocks=256,
    max_num_seqs=8,
)


def by_tenant(plan: AdmissionPlan, waiting: list[WaitingRequest]) -> dict[str | None, list[str]]:
    tenant_of = {r.request_id: r.tenant_id for r in waiting}
    groups: dict[str | None, list[str]] = {}
    for request_id in plan.request_ids:
        groups.setdefault(tenant_of[request_id], []).append(request_id)
    return groups


@settings(max_examples=100, deadline=None)
@given(rows=waiting_lists, inner=st.sampled_from(sorted(INNER_POLICIES)), served=st.lists(st.integers(0, 29)))
def test_within_a_tenant_the_inner_policys_order_and_plan_flags_are_kept(
    rows: list[tuple[str | None, int, int, int]], inner: str, served: list[int]
) -> None:
    waiting = waiting_requests(rows)
    policy, alone = FairSharePolicy(INNER_POLICIES[inner]()), INNER_POLICIES[inner]()
    for planner in (policy, alone):  # the same history for the wrapped policy and the policy alone
        planner.plan(waiting, BUDGET)
        for i in served:  # charge some tenants unevenly
            if i < len(waiting):
                planner.on_admitted(waiting[i].request_id)
    remaining = [r for i, r in enumerate(waiting) if i not in set(served)] or waiting[:1]
    expected = alone.plan(remaining, BUDGET)
    plan = policy.plan(remaining, BUDGET)
    assert sorted(plan.request_ids) == sorted(expected.request_ids)
    assert by_tenant(plan, remaining) == by_tenant(expected, remaining)
    assert plan.is_head_of_line_blocking == expected.is_head_of_line_blocking
    assert plan.bypass_ids == expected.bypass_ids
    if expected.group_ids:
        assert dict(zip(plan.request_ids, plan.group_ids)) == dict(
            zip(expected.request_ids, expected.group_ids)
        )


@settings(max_examples=100, deadline=None)
@given(rows=waiting_lists, inner=st.sampled_from(sorted(INNER_POLICIES)))
def test_one_tenant_gets_the_inner_plan_unchanged(
    rows: list[tuple[str | None, int, int, int]], inner: str
) -> None:
    waiting = waiting_requests([(None, *row[1:]) for row in rows])
    assert FairSharePolicy(INNER_POLICIES[inner]()).plan(waiting, BUDGET) == INNER_POLICIES[inner]().plan(
        waiting, BUDGET
    )


def test_the_least_served_tenant_goes_first_and_its_counter_is_projected_per_admission() -> None:
    policy = FairSharePolicy(FifoPolicy())
    waiting = [
        WaitingRequest("a1", 0.0, 100, 4, tenant_id="a"),
        WaitingRequest("a2", 1.0, 100, 4, tenant_id="a"),
        WaitingRequest("b1", 2.0, 10, 4, tenant_id="b"),
        WaitingRequest("b2", 3.0, 10, 4, tenant_id="b"),
        WaitingRequest("b3", 4.0, 200, 4, tenant_id="b"),
    ]
    # both start level (0): a's oldest first (inner order breaks the tie), then b until b passes a (100)
    assert policy.plan(waiting, BUDGET).request_ids == ("a1", "b1", "b2", "b3", "a2")
    policy.on_admitted("a1")
    policy.on_tokens_served({"a1": 1})
    assert policy.counter("a") == 100 * DEFAULT_PROMPT_WEIGHT + DEFAULT_OUTPUT_WEIGHT
    assert policy.plan(waiting[1:], BUDGET).request_ids == ("b1", "b2", "b3", "a2")


def test_a_tenant_of_weight_two_is_charged_half() -> None:
    policy = FairSharePolicy(FifoPolicy())
    policy.plan([WaitingRequest("a1", 0.0, 100, 4, tenant_id="a", tenant_weight=2.0)], BUDGET)
    policy.on_admitted("a1")
    policy.on_admitted("a1")  # a readmission after a preemption charges nothing
    policy.on_tokens_served({"a1": 3, "unknown": 5})
    assert policy.counter("a") == (100 * DEFAULT_PROMPT_WEIGHT + 3 * DEFAULT_OUTPUT_WEIGHT) / 2


def test_a_returning_tenant_is_lifted_to_the_least_served_active_tenant() -> None:
    policy = FairSharePolicy(FifoPolicy())
    policy.plan([WaitingRequest("b1", 0.0, 10, 4, tenant_id="b")], BUDGET)
    policy.on_admitted("b1")
    policy.on_finished("b1")  # b leaves with counter 10
    policy.plan([WaitingRequest("a1", 1.0, 500, 4, tenant_id="a")], BUDGET)
    policy.on_admitted("a1")  # a alone: lifted to 10 (the last to leave), then charged 500
    policy.plan([WaitingRequest("b2", 2.0, 10, 4, tenant_id="b")], BUDGET)
    assert policy.counter("b") == policy.counter("a") == 510


def test_bad_weights_are_refused_with_what_to_change() -> None:
    with pytest.raises(ValueError, match="prompt_weight and output_weight"):
        FairSharePolicy(FifoPolicy(), prompt_weight=0, output_weight=0)
    with pytest.raises(ValueError, match="tenant_weight must be positive"):
        FairSharePolicy(FifoPolicy()).plan(
            [WaitingRequest("a1", 0.0, 1, 1, tenant_id="a", tenant_weight=0)], BUDGET
        )


@st.composite
def flood_then_newcomers(draw: st.DrawFn) -> list[Arrival]:
    """Tenant a floods at step 0 (more requests than slots); newcomers c0, c1, ... arrive one request each,
    later, each after the one before has finished (one reserved slot serves one newcomer at a time)."""
    flood = [Arrival(0, "a", p, o) for p, o in draw(st.lists(sizes, min_size=12, max_size=40))]
    gaps = draw(st.lists(st.integers(MAX_OUTPUT + 1, 3 * MAX_OUTPUT), min_size=1, max_size=4))
    steps = [1 + sum(gaps[:i]) for i in range(len(gaps))]
    return flood + [Arrival(step, f"c{i}", *draw(sizes)) for i, step in enumerate(steps)]


@settings(max_examples=60, deadline=None)
@given(arrivals=flood_then_newcomers(), max_num_seqs=st.integers(2, 8))
def test_with_a_reserved_slot_a_newcomer_is_admitted_at_the_next_step_while_a_flood_fills_the_batch(
    arrivals: list[Arrival], max_num_seqs: int
) -> None:
    engine = StandInEngine(FairSharePolicy(FifoPolicy(), num_reserved_seqs=1), max_num_seqs)
    run(engine, arrivals, num_steps=120)
    arrived = {f"{a.tenant}-{i}": a.step for i, a in enumerate(arrivals)}
    for request_id, step in arrived.items():
        if request_id.startswith("c"):  # each newcomer's one request: admitted at the step it arrived
            assert engine.step_of[request_id] == step, (request_id, step, engine.step_of.get(request_id))
    # the flood still uses every slot but the reserved one
    busiest = max(
        sum(
            1
            for r, s in engine.step_of.items()
            if r.startswith("a-") and s <= t and engine.step_of[r] + engine.num_output_tokens[r] > t
        )
        for t in range(20)
    )
    assert busiest == max_num_seqs - 1


def test_without_a_reserve_a_newcomer_waits_for_a_flooding_tenants_request_to_finish() -> None:
    flood = [Arrival(0, "a", 8, 8) for _ in range(12)]
    engine = StandInEngine(FairSharePolicy(FifoPolicy()), max_num_seqs=4)
    run(engine, [*flood, Arrival(2, "c", 8, 1)], num_steps=40)
    assert engine.step_of["c-12"] == 8  # every slot was a's until a's first four finished


def test_requests_without_a_tenant_are_never_held_back_by_the_reserve() -> None:
    policy = FairSharePolicy(FifoPolicy(), num_reserved_seqs=1)
    waiting = [WaitingRequest(f"r{i}", float(i), 8, 4) for i in range(4)]
    budget = BatchBudget(num_free_seqs=4, num_free_tokens=10**6, num_free_blocks=10**6, block_size=16)
    assert policy.plan(waiting, budget).request_ids == ("r0", "r1", "r2", "r3")
    with pytest.raises(ValueError, match="num_reserved_seqs"):
        FairSharePolicy(FifoPolicy(), num_reserved_seqs=-1)


def test_a_tenant_with_requests_running_but_none_waiting_banks_no_service() -> None:
    """VTC lifts a tenant when it becomes backlogged, not only when it becomes active: b's one long request ran
    while a used three slots, so b's counter fell far behind; b's burst afterwards must not take the engine."""
    flood = [Arrival(0, "a", 1, 8) for _ in range(80)]
    arrivals = [*flood, Arrival(0, "b", 1, 100), *[Arrival(50, "b", 1, 8) for _ in range(6)]]
    engine = StandInEngine(FairSharePolicy(FifoPolicy()), max_num_seqs=4)
    run(engine, arrivals, num_steps=60)
    after_burst = [r for r in engine.admitted if engine.step_of[r] >= 50][:6]
    assert sum(r.startswith("a-") for r in after_burst) >= 2, after_burst  # interleaved, not b's burst first


def test_a_light_tenant_whose_earlier_request_still_runs_also_gets_the_reserved_slot() -> None:
    """a's flood fills 3 of 4 slots, b's first request the reserved one; when one of a's finishes, the freed
    (last) slot goes to b's second request, b being below its share (4 / (2 tenants + 1)), not to a (at its
    share) and not left idle."""
    flood = [Arrival(0, "a", 4, 8), Arrival(0, "a", 4, 8), Arrival(0, "a", 4, 3)]
    flood += [Arrival(0, "a", 4, 8) for _ in range(20)]
    arrivals = [*flood, Arrival(1, "b", 4, 8), Arrival(2, "b", 4, 8)]
    engine = StandInEngine(FairSharePolicy(FifoPolicy(), num_reserved_seqs=1), max_num_seqs=4)
    run(engine, arrivals, num_steps=5)
    assert (engine.step_of["b-23"], engine.step_of["b-24"]) == (1, 3)
