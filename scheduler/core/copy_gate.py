"""Which sequences of an adapter still being loaded run this step (CaraServe's CPU-assisted prefill), and
the counters of the outcomes.

Loads are asynchronous. While the adapter is PREPARING (its host copy is read, validated and packed off the
step loop, until `BatchScheduler.on_adapter_prepared`) none of its sequences runs: there is no host copy to
compute on yet. While it is COPYING (until `BatchScheduler.on_adapter_loaded`), a sequence of that adapter
runs only as a CPU-assisted prefill: a prefill chunk whose LoRA delta is computed from the host copy by one
of `num_cpu_prefill_workers` CPU workers. Decodes, and prefills beyond the free workers (0 workers: every
one), skip the step and wait for the copy. Both kinds of waiting are in `StepPlan.copy_waits` (the engine
idles on them when nothing else runs). Each request counts at most once in `num_cpu_assisted_prefills`, once
in `num_copy_waits` (it waited for a copy whose host copy was ready) and once in `num_prepare_waits` (it
waited for its adapter's preparation).
"""

from __future__ import annotations

from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.sequence import BatchEntry, Sequence
from scheduler.core.step_plan import StepPlan


class CopyGate:
    """Gates the sequences of adapters being loaded (PREPARING, COPYING), one CPU worker per host-assisted
    entry."""

    def __init__(self, residency: AdapterResidency, num_cpu_prefill_workers: int) -> None:
        if num_cpu_prefill_workers < 0:
            raise ValueError(f"num_cpu_prefill_workers must be >= 0, got {num_cpu_prefill_workers}")
        self.residency = residency
        self.num_cpu_prefill_workers = num_cpu_prefill_workers
        self.num_cpu_assisted_prefills = 0  # requests whose prefill ran (at least partly) on a host copy
        self.num_copy_waits = 0  # requests that waited at least one step for their adapter's copy
        self.num_prepare_waits = 0  # requests that waited at least one step for their adapter's host copy
        self._host_assisted: set[str] = set()  # request ids counted in num_cpu_assisted_prefills
        self._copy_waiters: set[str] = set()  # request ids counted in num_copy_waits
        self._prepare_waiters: set[str] = set()  # request ids counted in num_prepare_waits

    def _residency(self, seq: Sequence) -> Residency | None:
        return None if seq.adapter_id is None else self.residency.residency(seq.adapter_id)

    def may_run(self, seq: Sequence, plan: StepPlan) -> bool:
        """False (and seq recorded in plan.copy_waits) when seq must wait for its adapter's preparation or
        copy this step."""
        residency = self._residency(seq)
        if residency is Residency.PREPARING:
            self.num_prepare_waits += _wait(seq, plan, self._prepare_waiters)
            return False
        if residency is not Residency.COPYING:
            return True
        is_prefill = seq.num_computed_tokens < seq.num_prompt_tokens
        if is_prefill and self._num_host_entries(plan) < self.num_cpu_prefill_workers:
            return True
        self.num_copy_waits += _wait(seq, plan, self._copy_waiters)
        return False

    def _num_host_entries(self, plan: StepPlan) -> int:
        return sum(e.seq.adapter_id in plan.host_assisted_adapters for e in plan.entries)

    def add_entry(self, plan: StepPlan, seq: Sequence, num_new: int) -> None:
        """Add seq's entry to the plan; one of a COPYING adapter runs on the host copy."""
        plan.entries.append(BatchEntry(seq, num_new))
        adapter_id = seq.adapter_id
        if adapter_id is not None and self.residency.residency(adapter_id) is Residency.COPYING:
            plan.host_assisted_adapters.add(adapter_id)
            if seq.request_id not in self._host_assisted:
                self._host_assisted.add(seq.request_id)
                self.num_cpu_assisted_prefills += 1

    def forget(self, request_id: str) -> None:
        """A request finished: drop it from the per-request bookkeeping."""
        self._host_assisted.discard(request_id)
        self._copy_waiters.discard(request_id)
        self._prepare_waiters.discard(request_id)


def _wait(seq: Sequence, plan: StepPlan, waiters: set[str]) -> int:
    """Record seq in plan.copy_waits; 1 the first time it waits this way (it joins `waiters`), else 0."""
    plan.copy_waits.append(seq.request_id)
    if seq.request_id in waiters:
        return 0
    waiters.add(seq.request_id)
    return 1
