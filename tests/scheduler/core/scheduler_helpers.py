"""Shared builders of the engine-core scheduler tests: the page geometry, sequences, a manual clock, the
stand-in executor that carries out a plan, the invariants every plan keeps, and adapter registration."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import Sequence, SequenceStatus
from scheduler.core.step_plan import StepPlan

PAGE_BYTES = 100
BLOCK_SIZE = 4

# (rank, bytes) of six adapters a0..a5
adapter_sizes = st.lists(st.tuples(st.integers(1, 16), st.integers(1, 1200)), min_size=6, max_size=6)


def request_lists(
    max_arrival_step: int, max_size: int
) -> st.SearchStrategy[list[tuple[int, int, int | None, int]]]:
    """Requests as (num_prompt, max_tokens, adapter index 0..5 or None for the base model, arrival step)."""
    return st.lists(
        st.tuples(
            st.integers(1, 12),
            st.integers(1, 6),
            st.one_of(st.none(), st.integers(0, 5)),
            st.integers(0, max_arrival_step),
        ),
        min_size=1,
        max_size=max_size,
    )


@dataclass(frozen=True)
class Setup:
    """Pool and batch limits of one scheduler (num_adapter_pages 0: a unified pool)."""

    num_kv_pages: int
    num_adapter_pages: int
    max_num_seqs: int
    max_num_batched_tokens: int
    eviction_policy: str = "lru"


@dataclass
class ManualClock:
    """The scheduler's clock, advanced by the test."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def make_seq(
    request_id: str, num_prompt: int, max_tokens: int, adapter_id: str | None, arrival: float
) -> Sequence:
    """A greedy request of prompt tokens 1..num_prompt."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return Sequence(
        request_id, list(range(1, num_prompt + 1)), params, adapter_id, max_tokens, arrival_time=arrival
    )


def carry_out(scheduler: BatchScheduler, plan: StepPlan) -> None:
    """What the engine does with a plan, minus the tensors: every sampling entry samples token 7."""
    for load in plan.adapter_loads:
        scheduler.on_adapter_loaded(load.adapter_id)
    sampled: list[int | None] = [7 for e in plan.runnable_entries() if e.is_sampling]
    scheduler.update_from_output(plan, sampled, now=scheduler.clock())


def check_plan(
    scheduler: BatchScheduler, plan: StepPlan, running_before: dict[str, str], setup: Setup
) -> None:
    """Invariants every plan keeps."""
    assert plan.num_batched_tokens <= setup.max_num_batched_tokens
    assert len(scheduler.running) <= setup.max_num_seqs
    assert len({id(e.seq) for e in plan.entries}) == len(plan.entries)
    assert all(e.num_new_tokens > 0 for e in plan.entries)
    # A running request's adapter is never evicted (a request preempted in this step no longer runs).
    still_running = {rid: a for rid, a in running_before.items() if rid not in plan.preemptions}
    assert not set(plan.adapter_evictions) & set(still_running.values())
    loads = {load.adapter_id for load in plan.adapter_loads}
    in_use = {s.adapter_id for s in scheduler.running}
    assert not (set(plan.adapter_evictions) - loads) & in_use
    residency = scheduler.residency
    for entry in plan.entries:
        seq = entry.seq
        assert seq.status is SequenceStatus.RUNNING
        assert len(seq.block_table) * BLOCK_SIZE >= seq.num_computed_tokens + entry.num_new_tokens
        if seq.adapter_id is not None:
            state = residency.residency(seq.adapter_id)
            assert state is Residency.DEVICE or (state is Residency.COPYING and seq.adapter_id in loads)
    pool = scheduler.pool
    device_pages = sum(len(residency.get(a).page_ids) for a in residency.device_adapters())  # type: ignore[union-attr]
    assert pool.num_adapter_pages == device_pages
    assert pool.num_used_pages + pool.num_free_pages == pool.num_pages


def register_fitting_adapters(
    residency: AdapterResidency, adapters: list[tuple[int, int]], setup: Setup
) -> None:
    """Register a0, a1, ... of (rank, bytes), each shrunk until it fits alone (static: in the adapter share;
    unified: beside the longest request), or nothing could ever run it."""
    for i, (rank, num_bytes) in enumerate(adapters):
        state = residency.register(f"a{i}", f"/host/a{i}", rank, num_bytes)
        limit = setup.num_adapter_pages if setup.num_adapter_pages else setup.num_kv_pages - 5
        while residency.num_pages_for(state) > limit:
            state.num_bytes = max(1, state.num_bytes // 2)
