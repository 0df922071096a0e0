"""What the batch policy sees of a waiting sequence (scheduler/admission/admission.py WaitingRequest)."""

from __future__ import annotations

from scheduler.admission.admission import WaitingRequest
from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.sequence import Sequence


def describe_waiting(seq: Sequence, residency: AdapterResidency) -> WaitingRequest:
    """The policy's view of `seq`: its sizes, predicted length, tenant and its adapter's rank and residency."""
    state = residency.get(seq.adapter_id) if seq.adapter_id is not None else None
    return WaitingRequest(
        request_id=seq.request_id,
        arrival_time=seq.arrival_time,
        num_prompt_tokens=seq.num_tokens,
        max_tokens=seq.max_tokens,
        adapter_id=seq.adapter_id,
        adapter_rank=state.rank if state is not None else 0,
        predicted_output_tokens=(
            seq.max_tokens if seq.predicted_output_tokens is None else seq.predicted_output_tokens
        ),
        adapter_num_bytes=state.num_bytes if state is not None else 0,
        adapter_residency=state.residency.value if state is not None else Residency.NONE.value,
        tenant_id=seq.tenant_id,
        tenant_weight=seq.tenant_weight,
    )
