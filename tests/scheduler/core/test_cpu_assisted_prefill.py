"""CPU-assisted prefill decisions of the engine core (pure): which entries run on an adapter's host copy
while its device copy is under way, and which wait: for the host copy's preparation (off the step loop;
nothing runs on a host copy not made yet), or for the copy."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from scheduler.core.sequence import Sequence, SequenceStatus
from scheduler.core.step_plan import StepPlan
from tests.scheduler.core.scheduler_helpers import BLOCK_SIZE, PAGE_BYTES, make_seq


def make(num_workers: int, budget: int = 64, num_kv_pages: int = 32) -> BatchScheduler:
    pool = PagePool(num_kv_pages + 8, BLOCK_SIZE, num_kv_pages)
    residency = AdapterResidency(pool, PAGE_BYTES)
    for name in ("cold", "other"):
        residency.register(name, f"/host/{name}", rank=4, num_bytes=100)
    return BatchScheduler(pool, residency, FifoPolicy(), 8, budget, num_cpu_prefill_workers=num_workers)


def advance(scheduler: BatchScheduler, plan: StepPlan) -> None:
    """Compute every entry; a sampling entry samples token 7 (a sequence at its max_tokens finishes)."""
    sampled: list[int | None] = [7 for e in plan.entries if e.is_sampling]
    scheduler.update_from_output(plan, sampled, now=0.0)


def ids(plan: StepPlan) -> list[str]:
    return [e.seq.request_id for e in plan.entries]


def prepared(scheduler: BatchScheduler, plan: StepPlan) -> None:
    """The executor made the host copies of the plan's loads (their copies run on)."""
    for load in plan.adapter_loads:
        scheduler.on_adapter_prepared(load.adapter_id)


def test_cold_prefill_waits_for_the_host_copy_then_runs_on_it_at_once() -> None:
    scheduler = make(num_workers=1)
    scheduler.add(make_seq("r", 5, 3, "cold", 0.0))
    scheduler.add(make_seq("base", 3, 3, None, 1.0))
    plan = scheduler.schedule()
    assert [load.adapter_id for load in plan.adapter_loads] == ["cold"]
    assert ids(plan) == ["base"] and plan.copy_waits == ["r"]  # the others run while it is prepared
    assert scheduler.residency.residency("cold") is Residency.PREPARING
    advance(scheduler, plan)
    assert ids(scheduler.schedule()) == ["base"]  # still preparing: still waiting
    prepared(scheduler, plan)
    plan = scheduler.schedule()
    assert ids(plan) == ["r", "base"] or ids(plan) == ["base", "r"]
    assert plan.host_assisted_adapters == {"cold"} and plan.copy_waits == []
    assert scheduler.residency.residency("cold") is Residency.COPYING
    gate = scheduler.copy_gate
    assert (gate.num_cpu_assisted_prefills, gate.num_copy_waits, gate.num_prepare_waits) == (1, 0, 1)


def test_decode_waits_for_the_copy_then_runs_on_the_device_copy() -> None:
    scheduler = make(num_workers=2)
    scheduler.add(make_seq("r", 5, 3, "cold", 0.0))
    prepared(scheduler, scheduler.schedule())
    advance(scheduler, scheduler.schedule())  # the whole prompt, on the host copy
    plan = scheduler.schedule()
    assert plan.entries == [] and plan.copy_waits == ["r"]  # a decode never runs on the host copy
    scheduler.on_adapter_loaded("cold")
    plan = scheduler.schedule()
    assert ids(plan) == ["r"] and not plan.host_assisted_adapters and plan.entries[0].num_new_tokens == 1
    assert scheduler.copy_gate.num_copy_waits == 1


def test_chunked_prefill_keeps_running_on_the_host_copy_while_it_copies() -> None:
    scheduler = make(num_workers=1, budget=2)
    scheduler.add(make_seq("r", 5, 2, "cold", 0.0))
    prepared(scheduler, scheduler.schedule())
    for _ in range(3):  # chunks of 2, 2, 1
        plan = scheduler.schedule()
        assert ids(plan) == ["r"] and plan.host_assisted_adapters == {"cold"}
        advance(scheduler, plan)
    assert scheduler.schedule().copy_waits == ["r"]
    assert scheduler.copy_gate.num_cpu_assisted_prefills == 1


def test_busy_pool_falls_back_to_waiting_for_the_copy() -> None:
    scheduler = make(num_workers=1)
    scheduler.add(make_seq("a", 5, 2, "cold", 0.0))
    scheduler.add(make_seq("b", 4, 2, "cold", 1.0))
    scheduler.add(make_seq("c", 3, 5, None, 2.0))
    plan = scheduler.schedule()
    assert ids(plan) == ["c"] and plan.copy_waits == ["a", "b"]  # both wait for the host copy
    advance(scheduler, plan)
    prepared(scheduler, plan)
    plan = scheduler.schedule()
    assert sorted(ids(plan)) == ["a", "c"] and plan.copy_waits == ["b"]
    assert scheduler.get("b").status is SequenceStatus.WAITING  # type: ignore[union-attr]
    advance(scheduler, plan)
    scheduler.on_adapter_loaded("cold")
    plan = scheduler.schedule()
    assert sorted(ids(plan)) == ["a", "b", "c"] and not plan.host_assisted_adapters


def test_no_workers_means_every_request_of_a_copying_adapter_waits() -> None:
    scheduler = make(num_workers=0)
    scheduler.add(make_seq("a", 5, 2, "cold", 0.0))
    scheduler.add(make_seq("c", 3, 2, None, 1.0))  # not blocked behind the copy
    plan = scheduler.schedule()
    assert (
        ids(plan) == ["c"] and plan.copy_waits == ["a"] and scheduler.copy_gate.num_cpu_assisted_prefills == 0
    )


@settings(max_examples=150, deadline=None)
@given(
    num_workers=st.integers(0, 3),
    budget=st.integers(1, 24),
    reqs=st.lists(
        st.tuples(st.integers(1, 10), st.integers(1, 4), st.sampled_from(["cold", "other", None])),
        min_size=1,
        max_size=8,
    ),
    prepare_steps=st.integers(0, 4),
    copy_steps=st.integers(0, 6),
)
def test_host_copy_runs_only_prefills_within_the_workers_and_everything_finishes(
    num_workers: int,
    budget: int,
    reqs: list[tuple[int, int, str | None]],
    prepare_steps: int,
    copy_steps: int,
) -> None:
    scheduler = make(num_workers, budget, num_kv_pages=40)
    seqs: list[Sequence] = []
    for i, (num_prompt, max_tokens, adapter) in enumerate(reqs):
        seq = make_seq(f"r{i}", num_prompt, max_tokens, adapter, float(i))
        scheduler.add(seq)
        seqs.append(seq)
    preparing: dict[str, int] = {}  # adapter -> steps left until its host copy is ready
    copying: dict[str, int] = {}  # adapter -> steps left until its copy lands
    for _ in range(500):
        if not scheduler.has_unfinished():
            break
        plan = scheduler.schedule()
        for load in plan.adapter_loads:
            preparing[load.adapter_id] = prepare_steps
        host_entries = [e for e in plan.entries if e.seq.adapter_id in plan.host_assisted_adapters]
        assert len(host_entries) <= num_workers
        for entry in plan.entries:
            assert entry.seq.adapter_id is None or entry.seq.adapter_id not in preparing  # no host copy yet
            if entry.seq.adapter_id is not None and entry.seq.adapter_id in copying:
                assert entry.seq.adapter_id in plan.host_assisted_adapters
                assert entry.seq.num_computed_tokens < entry.seq.num_prompt_tokens  # prefills only
        advance(scheduler, plan)
        for adapter_id in list(copying):  # a copy may land at any step
            copying[adapter_id] -= 1
            if copying[adapter_id] < 0:
                del copying[adapter_id]
                scheduler.on_adapter_loaded(adapter_id)
        for adapter_id in list(preparing):  # and a host copy may be ready at any step
            preparing[adapter_id] -= 1
            if preparing[adapter_id] < 0:
                del preparing[adapter_id]
                scheduler.on_adapter_prepared(adapter_id)
                copying[adapter_id] = copy_steps
    assert all(s.is_finished for s in seqs)
