"""What a batch policy sees and returns: the waiting requests, this step's budget, and the admission plan.

Plain data only (imports none of this project's modules), so that every policy module (scheduler/admission/batch_policy.py,
scheduler/multiqueue/multiqueue.py) and the engine's core (scheduler/core/batch_scheduler.py) share one vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class WaitingRequest:
    """What a policy may know about one waiting request.

    `predicted_output_tokens`: the predicted output length (max_tokens until a predictor fills it);
    `adapter_num_bytes`: device bytes of its adapter (0 without one); `adapter_residency`: where the
    adapter is now, "none" | "host" | "preparing" | "copying" | "device"; `tenant_id`: who sent it (None: not
    known, direct engine use); `tenant_weight`: that tenant's share weight (scheduler/admission/fair_share.py;
    default 1).
    """

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int
    adapter_id: str | None = None
    adapter_rank: int = 0
    predicted_output_tokens: int | None = None
    adapter_num_bytes: int = 0
    adapter_residency: str = "none"
    tenant_id: str | None = None
    tenant_weight: float = 1.0

    @property
    def num_predicted_output_tokens(self) -> int:
        """The prediction, or max_tokens when there is none."""
        return self.max_tokens if self.predicted_output_tokens is None else self.predicted_output_tokens


@dataclass(frozen=True)
class BatchBudget:
    """What is left for new requests in this engine step, and the size of the whole pool.

    `now`: the scheduler's clock, the same clock as `WaitingRequest.arrival_time` (None: not given);
    `num_total_blocks`: the KV pool's capacity in blocks (pages the KV cache can address; 0: not given);
    `num_bytes_per_block`: device bytes of one block, so adapter bytes can be expressed in blocks
    (0: not given); `max_num_seqs`: how many sequences a step may run at all (0: not given);
    `is_adapter_memory_shared`: adapters take their pages from the KV pool (engine_memory_mode "unified"),
    or, when False, from a share of their own that KV blocks never use ("static"); `max_running_tokens`: the
    running batch's token bound (scheduler/admission/running_budget.py; 0: none).
    """

    num_free_seqs: int
    num_free_tokens: int
    num_free_blocks: int
    block_size: int
    now: float | None = None
    num_total_blocks: int = 0
    num_bytes_per_block: int = 0
    max_num_seqs: int = 0
    is_adapter_memory_shared: bool = True
    max_running_tokens: int = 0


@dataclass(frozen=True)
class AdmissionPlan:
    """Request ids in the order the scheduler should try to admit them.

    `is_head_of_line_blocking`: stop at the first request that does not fit for lack of memory (FIFO,
    non-preemptive); when False the scheduler skips it and tries the next.
    `group_ids` (empty, or one per request id): with head-of-line blocking, a request that does not fit
    blocks only the later requests of its own group (a multi-queue policy's queues); empty = one group.
    `bypass_ids`: requests that may still be tried after an earlier request of their group failed because
    its adapter could not get device memory (not for lack of KV blocks); every other later request of a
    group so blocked is skipped.
    `barrier_ids`: requests that, when their KV does not fit, stop the whole step's admission, groups or
    not, so that the memory freed next goes to them first (a multi-queue policy's requests promoted past
    its age bound); `adapter_barrier_ids` (a subset of them): those that stop it also when their adapter
    finds no device memory.
    """

    request_ids: tuple[str, ...]
    is_head_of_line_blocking: bool = True
    group_ids: tuple[int, ...] = ()
    bypass_ids: frozenset[str] = field(default_factory=frozenset)
    barrier_ids: frozenset[str] = field(default_factory=frozenset)
    adapter_barrier_ids: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.group_ids and len(self.group_ids) != len(self.request_ids):
            raise ValueError(
                f"group_ids must be empty or have one id per request ({len(self.request_ids)}), "
                f"got {len(self.group_ids)}"
            )


class BatchPolicy(Protocol):
    """Decides the admission order of waiting requests; called once per engine step."""

    def plan(self, waiting: Sequence[WaitingRequest], budget: BatchBudget) -> AdmissionPlan:
        """Return the admission order for this step."""
        ...

    def on_admitted(self, request_id: str, now: float | None = None) -> None:
        """Called when the scheduler actually admits a planned request (again after each preemption);
        `now`: the scheduler's clock (the clock of `BatchBudget.now`)."""
        ...

    def on_finished(self, request_id: str, now: float | None = None) -> None:
        """Called when a request finishes or is aborted, admitted or not (quota bookkeeping); `now` as above."""
        ...

    def on_tokens_served(self, num_output_tokens: Mapping[str, int]) -> None:
        """Called once per planned step with the output tokens that step computes per running request id
        (fair-share bookkeeping: scheduler/admission/fair_share.py)."""
        ...
