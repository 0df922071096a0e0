"""Which sequences of a still-copying adapter run this step (CaraServe's CPU-assisted prefill), and the
counters of both outcomes.

Copies are asynchronous (the adapter is COPYING until `BatchScheduler.on_adapter_loaded`). While it copies,
a sequence of that adapter runs only as a CPU-assisted prefill: a prefill chunk whose LoRA delta is
computed from the host copy by one of `num_cpu_prefill_workers` CPU workers. Decodes, and prefills beyond
the free workers (0 workers: every one), skip the step and wait for the copy (`StepPlan.copy_waits`).
Each request counts at most once in `num_cpu_assisted_prefills` and once in `num_copy_waits`.
"""

from __future__ import annotations

from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.sequence import BatchEntry, Sequence
from scheduler.core.step_plan import StepPlan


class CopyGate:
    """Gates the sequences of COPYING adapters, one CPU worker per host-assisted entry."""

    def __init__(self, residency: AdapterResidency, num_cpu_prefill_workers: int) -> None:
        if num_cpu_prefill_workers < 0:
            raise ValueError(f"num_cpu_prefill_workers must be >= 0, got {num_cpu_prefill_workers}")
        self.residency = residency
        self.num_cpu_prefill_workers = num_cpu_prefill_workers
        self.num_cpu_assisted_prefills = 0  # requests whose prefill ran (at least partly) on a host copy
        self.num_copy_waits = 0  # requests that waited at least one step for their adapter's copy
        self._host_assisted: set[str] = set()  # request ids counted in num_cpu_assisted_prefills
        self._copy_waiters: set[str] = set()  # request ids counted in num_copy_waits

    def _is_copying(self, seq: Sequence) -> bool:
        return seq.adapter_id is not None and self.residency.residency(seq.adapter_id) is Residency.COPYING

    def may_run(self, seq: Sequence, plan: StepPlan) -> bool:
        """False (and seq recorded in plan.copy_waits) when seq must wait for its adapter's copy this step."""
        if not self._is_copying(seq):
            return True
        is_prefill = seq.num_computed_tokens < seq.num_prompt_tokens
        if is_prefill and self._num_host_entries(plan) < self.num_cpu_prefill_workers:
            return True
        plan.copy_waits.append(seq.request_id)
        if seq.request_id not in self._copy_waiters:
            self._copy_waiters.add(seq.request_id)
            self.num_copy_waits += 1
        return False

    def _num_host_entries(self, plan: StepPlan) -> int:
        return sum(e.seq.adapter_id in plan.host_assisted_adapters for e in plan.entries)

    def add_entry(self, plan: StepPlan, seq: Sequence, num_new: int) -> None:
        """Add seq's entry to the plan; one of a COPYING adapter runs on the host copy."""
        plan.entries.append(BatchEntry(seq, num_new))
        if seq.adapter_id is not None and self._is_copying(seq):
            plan.host_assisted_adapters.add(seq.adapter_id)
            if seq.request_id not in self._host_assisted:
                self._host_assisted.add(seq.request_id)
                self.num_cpu_assisted_prefills += 1

    def forget(self, request_id: str) -> None:
        """A request finished: drop it from the per-request bookkeeping."""
        self._host_assisted.discard(request_id)
        self._copy_waiters.discard(request_id)
