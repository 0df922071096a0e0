"""Admission policies for the engine's batch scheduler: plain data in, decision out (no torch).

The engine's batch scheduler asks a `BatchPolicy` which waiting requests to try to admit, in what order.
The scheduler then admits them while KV blocks and the token/sequence budget allow. `FifoPolicy` and
`SjfPolicy` are the baselines; a multi-queue policy (Chameleon-style) implements the same interface later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class WaitingRequest:
    """What a policy may know about one waiting request.

    `predicted_output_tokens`: the predicted output length (max_tokens until a predictor fills it);
    `adapter_num_bytes`: device bytes of its adapter (0 without one); `adapter_residency`: where the
    adapter is now, "none" | "host" | "copying" | "device".
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

    @property
    def num_predicted_output_tokens(self) -> int:
        """The prediction, or max_tokens when there is none."""
        return self.max_tokens if self.predicted_output_tokens is None else self.predicted_output_tokens


@dataclass(frozen=True)
class BatchBudget:
    """What is left for new requests in this engine step."""

    num_free_seqs: int
    num_free_tokens: int
    num_free_blocks: int
    block_size: int


@dataclass(frozen=True)
class AdmissionPlan:
    """Request ids in the order the scheduler should try to admit them.

    `is_head_of_line_blocking`: stop at the first request that does not fit (FIFO, non-preemptive);
    when False the scheduler skips it and tries the next.
    """

    request_ids: tuple[str, ...]
    is_head_of_line_blocking: bool = True


class BatchPolicy(Protocol):
    """Decides the admission order of waiting requests; called once per engine step."""

    def plan(self, waiting: Sequence[WaitingRequest], budget: BatchBudget) -> AdmissionPlan:
        """Return the admission order for this step."""
        ...

    def on_finished(self, request_id: str) -> None:
        """Called when an admitted request finishes or is aborted (quota bookkeeping)."""
        ...


class FifoPolicy:
    """First come, first served, with head-of-line blocking (the S-LoRA / vLLM default)."""

    def plan(self, waiting: Sequence[WaitingRequest], budget: BatchBudget) -> AdmissionPlan:
        """Admit in arrival order; ties keep submission order (sorted() is stable)."""
        if budget.num_free_seqs <= 0 or budget.num_free_tokens <= 0:
            return AdmissionPlan(request_ids=())
        ordered = sorted(waiting, key=lambda r: r.arrival_time)
        return AdmissionPlan(request_ids=tuple(r.request_id for r in ordered), is_head_of_line_blocking=True)

    def on_finished(self, request_id: str) -> None:
        """FIFO keeps no per-request state."""
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

    def on_finished(self, request_id: str) -> None:
        """SJF keeps no per-request state."""
        return


BATCH_POLICIES: dict[str, type] = {"fifo": FifoPolicy, "sjf": SjfPolicy}


def make_batch_policy(name: str) -> BatchPolicy:
    """The batch policy a setting names (e.g. engine_batch_policy="fifo"); ValueError lists the choices."""
    policy_class = BATCH_POLICIES.get(name)
    if policy_class is None:
        raise ValueError(f"unknown batch policy {name!r}; choose one of {sorted(BATCH_POLICIES)}")
    return policy_class()
