"""Which waiting requests to hand to an external engine now (the vLLM backend, issue 23).

An engine that runs its own batches (vLLM's AsyncLLM) still gets its requests in the platform's order: the
worker holds them and releases one only while the engine has room for it, so the batch policy
(scheduler/admission/batch_policy.py, scheduler/multiqueue/multiqueue.py, scheduler/admission/fair_share.py: `AdmissionPlan`) decides the order
and no request is ever refused because the engine's LoRA slots are full. Room is counted in what the engine
limits itself, sequences in flight (`max_num_seqs`) and distinct adapters in flight (`max_loras`); its memory is
its own business. With head-of-line blocking (FIFO) the first request that has no room stops the release, so it
cannot be passed forever by requests of adapters already in flight; otherwise (SJF, multi-queue) it is skipped
and the next one tried. Pure: plain data in, request ids out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.admission.admission import AdmissionPlan, WaitingRequest


@dataclass(frozen=True)
class ReleaseLimits:
    """The external engine's own limits: sequences it runs at once and distinct adapters in one batch."""

    max_num_seqs: int
    max_loras: int

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_loras < 1:
            raise ValueError(
                f"max_num_seqs ({self.max_num_seqs}) and max_loras ({self.max_loras}) must be >= 1"
            )


def release_now(
    plan: AdmissionPlan,
    waiting: Mapping[str, WaitingRequest],
    in_flight_by_adapter: Mapping[str | None, int],
    limits: ReleaseLimits,
) -> list[str]:
    """The ids of `plan` to release now, in plan order. `in_flight_by_adapter`: requests already released and
    not finished, per adapter id (None: the base model)."""
    num_in_flight = sum(in_flight_by_adapter.values())
    adapters = {a for a, n in in_flight_by_adapter.items() if a is not None and n > 0}
    released: list[str] = []
    for request_id in plan.request_ids:
        request = waiting.get(request_id)
        if request is None:
            continue  # finished or aborted since the plan was made
        if num_in_flight >= limits.max_num_seqs:
            break  # no sequence room for anyone
        adapter = request.adapter_id
        needs_slot = adapter is not None and adapter not in adapters
        if needs_slot and len(adapters) >= limits.max_loras:
            if plan.is_head_of_line_blocking:
                break
            continue
        released.append(request_id)
        num_in_flight += 1
        if adapter is not None:
            adapters.add(adapter)
    return released
