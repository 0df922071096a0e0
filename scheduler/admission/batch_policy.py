"""Admission policies for the engine's batch scheduler: plain data in, decision out (no torch).

The engine's batch scheduler asks a `BatchPolicy` which waiting requests to try to admit, in what order.
The scheduler then admits them while KV blocks and the token/sequence budget allow. `FifoPolicy` and
`SjfPolicy` are the baselines; `MultiQueuePolicy` (scheduler/multiqueue/multiqueue.py) is Chameleon's multi-queue
scheduler. The shared data types (what a policy sees and returns) live in scheduler/admission/admission.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.admission.admission import AdmissionPlan, BatchBudget, BatchPolicy, WaitingRequest
from scheduler.admission.fair_share import FairSharePolicy
from scheduler.multiqueue.multiqueue import MultiQueuePolicy

__all__ = ["BATCH_POLICIES", "FifoPolicy", "SjfPolicy", "make_batch_policy"]


class FifoPolicy:
    """First come, first served, with head-of-line blocking (the S-LoRA / vLLM default)."""

    def plan(self, waiting: Sequence[WaitingRequest], budget: BatchBudget) -> AdmissionPlan:
        """Admit in arrival order; ties keep submission order (sorted() is stable)."""
        if budget.num_free_seqs <= 0 or budget.num_free_tokens <= 0:
            return AdmissionPlan(request_ids=())
        ordered = sorted(waiting, key=lambda r: r.arrival_time)
        return AdmissionPlan(request_ids=tuple(r.request_id for r in ordered), is_head_of_line_blocking=True)

    def on_admitted(self, request_id: str, now: float | None = None) -> None:
        """FIFO keeps no per-request state."""
        return

    def on_finished(self, request_id: str, now: float | None = None) -> None:
        """FIFO keeps no per-request state."""
        return

    def on_tokens_served(self, num_output_tokens: Mapping[str, int]) -> None:
        """FIFO does not count served tokens."""
        return


class SjfPolicy:
    """Shortest predicted job first: the fewest predicted output tokens go first (ties: arrival order), and a
    request that does not fit is skipped, not waited on (no head-of-line blocking).

    The baseline Chameleon compares against. Non-preemptive, and with no aging: under sustained load a long
    request can wait behind a stream of shorter ones (that starvation is what the multi-queue policy's
    quotas address).
    """

    def plan(self, waiting: Sequence[WaitingRequest], budget: BatchBudget) -> AdmissionPlan:
        """Admit by predicted output length, then arrival."""
        if budget.num_free_seqs <= 0 or budget.num_free_tokens <= 0:
            return AdmissionPlan(request_ids=())
        ordered = sorted(waiting, key=lambda r: (r.num_predicted_output_tokens, r.arrival_time))
        return AdmissionPlan(request_ids=tuple(r.request_id for r in ordered), is_head_of_line_blocking=False)

    def on_admitted(self, request_id: str, now: float | None = None) -> None:
        """SJF keeps no per-request state."""
        return

    def on_finished(self, request_id: str, now: float | None = None) -> None:
        """SJF keeps no per-request state."""
        return

    def on_tokens_served(self, num_output_tokens: Mapping[str, int]) -> None:
        """SJF does not count served tokens."""
        return


BATCH_POLICIES: dict[str, type] = {"fifo": FifoPolicy, "sjf": SjfPolicy, "multiqueue": MultiQueuePolicy}


def make_batch_policy(name: str, **options: Any) -> BatchPolicy:
    """The batch policy a setting names (e.g. engine_batch_policy="fifo"); ValueError lists the choices.

    `options`: that policy's constructor knobs (e.g. `slo_s` of "multiqueue"); one it does not take is a
    ValueError.
    """
    policy_class = BATCH_POLICIES.get(name)
    if policy_class is None:
        raise ValueError(f"unknown batch policy {name!r}; choose one of {sorted(BATCH_POLICIES)}")
    unknown = sorted(set(options) - set(inspect.signature(policy_class).parameters))
    if unknown:
        raise ValueError(f"batch policy {name!r} has no option(s) {unknown}")
    return policy_class(**options)  # type: ignore[no-any-return]


def make_admission_policy(
    name: str, options: Mapping[str, Any], *, is_fair_share: bool, num_reserved_seqs: int, max_num_seqs: int
) -> BatchPolicy:
    """The engine's admission policy: the named batch policy, inside the tenants' fair share when
    `is_fair_share` (keeping up to `num_reserved_seqs` slots for a tenant with nothing running; one slot of
    `max_num_seqs` always stays usable)."""
    policy = make_batch_policy(name, **options)
    if not is_fair_share:
        return policy
    return FairSharePolicy(policy, num_reserved_seqs=min(num_reserved_seqs, max_num_seqs - 1))
