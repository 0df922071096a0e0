"""One step of the multi-queue scheduler's batch formation: two-phase admission under token quotas, and
which requests may bypass a head whose adapter cannot get device memory. Plain data in, order out.

Queues are indexed smallest size class first; each holds its requests in FIFO order. Per step:
  aged:     requests marked aged (they waited past the policy's age bound) go first, oldest first across
            queues, whatever their queue's quota (the starvation bound; the policy makes them barriers: one
            that does not fit stops the whole step's admission, so freed memory goes to it first);
  progress: the head of every idle queue (nothing charged to it) goes first, oldest head first, even if it
            needs more than the queue's whole quota (else such a request would wait forever);
  phase 1:  queues smallest first: admit in FIFO order while the queue's remaining quota covers the head's
            charge (a head that does not fit stops that queue); a queue left empty donates its unused
            quota to a spare pool;
  phase 2:  queues smallest first: admit from the spare pool while the head fits; a queue whose head does
            not fit gets nothing more this step.
A request already charged (preempted after its admission) costs nothing and always fits, even in a queue
whose quota is overdrawn. Non-preemptive: nothing already admitted is taken back. Quotas are charged by the caller on actual
admission; this module only plans.

Bypass (Chameleon's opportunistic rule): a planned request whose adapter is not on the device may fail to
get device memory for it. A later planned request of the same queue may then go first if its adapter is
ready (on the device, being copied, or none) and its predicted run time is below that head's predicted
wait. The head's wait is predicted from the running requests: sorted by predicted finish, the time at
which the tokens they return first cover the head's adapter (all of them finished, if they never do; no
running request: unbounded).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QueuedRequest:
    """A waiting request as batch formation sees it."""

    request_id: str
    arrival_time: float
    charge_tokens: int  # what admitting it charges its queue (0: already charged, e.g. after a preemption)
    adapter_tokens: int = 0  # its adapter's device memory in KV tokens
    is_adapter_ready: bool = True  # no adapter, or its adapter is on the device or being copied there
    predicted_run_s: float = 0.0
    is_aged: bool = False  # it waited past the age bound: planned before every quota


@dataclass(frozen=True)
class RunningRequest:
    """An admitted request still holding its charge: when it should finish, and what it returns."""

    predicted_remaining_s: float
    charge_tokens: int


def two_phase_order(
    queues: Sequence[Sequence[QueuedRequest]],
    quota_tokens: Sequence[float],
    charged_tokens: Sequence[float],
) -> list[tuple[QueuedRequest, int]]:
    """This step's admissions as (request, queue index), in the order to try them (see the module doc)."""
    if not len(queues) == len(quota_tokens) == len(charged_tokens):
        raise ValueError("queues, quota_tokens and charged_tokens need one entry per queue")
    remaining = [quota - used for quota, used in zip(quota_tokens, charged_tokens, strict=True)]
    next_index = [0] * len(queues)
    planned: list[tuple[QueuedRequest, int]] = []

    def take(q: int) -> int:
        request = queues[q][next_index[q]]
        planned.append((request, q))
        next_index[q] += 1
        return request.charge_tokens

    def take_charging(q: int) -> None:
        remaining[q] -= take(q)

    def head_fits(q: int, tokens: float) -> bool:
        """The head is there and fits `tokens` (an already charged head always does)."""
        if next_index[q] == len(queues[q]):
            return False
        charge = queues[q][next_index[q]].charge_tokens
        return charge <= 0 or charge <= tokens

    if any(r.is_aged for members in queues for r in members):
        _take_aged(queues, next_index, take_charging)
    idle = [
        q for q, members in enumerate(queues) if next_index[q] == 0 and members and charged_tokens[q] <= 0
    ]
    for q in sorted(idle, key=lambda q: queues[q][0].arrival_time):
        remaining[q] -= take(q)
    spare = 0.0
    for q in range(len(queues)):
        while head_fits(q, remaining[q]):
            remaining[q] -= take(q)
        if next_index[q] == len(queues[q]):
            spare += max(0.0, remaining[q])
    for q in range(len(queues)):
        while head_fits(q, spare):
            spare -= take(q)
    return planned


def _take_aged(
    queues: Sequence[Sequence[QueuedRequest]], next_index: list[int], take: Callable[[int], None]
) -> None:
    """Take every queue's aged prefix (already charged heads, free to readmit, ride along), oldest head
    first across queues, keeping each queue's own order."""

    def aged_head(q: int) -> QueuedRequest | None:
        if next_index[q] == len(queues[q]):
            return None
        head = queues[q][next_index[q]]
        return head if head.is_aged or head.charge_tokens <= 0 else None

    while True:
        heads = [(head.arrival_time, q) for q in range(len(queues)) if (head := aged_head(q)) is not None]
        if not heads:
            return
        take(min(heads)[1])


def predicted_wait_s(adapter_tokens: int, running: Sequence[RunningRequest]) -> float:
    """Seconds until the running requests return at least `adapter_tokens` tokens (see the module doc)."""
    if not running:
        return math.inf
    freed = 0
    finishes = sorted(running, key=lambda r: r.predicted_remaining_s)
    for request in finishes:
        freed += request.charge_tokens
        if freed >= adapter_tokens:
            return request.predicted_remaining_s
    return finishes[-1].predicted_remaining_s


def bypass_ids(
    planned: Sequence[tuple[QueuedRequest, int]], running: Sequence[RunningRequest]
) -> frozenset[str]:
    """Planned requests allowed past an earlier planned request of their queue whose adapter is not ready:
    their adapter is ready and their predicted run time is below every such earlier head's predicted wait."""
    min_wait: dict[int, float] = {}
    allowed: set[str] = set()
    for request, q in planned:
        if not request.is_adapter_ready:
            wait = predicted_wait_s(request.adapter_tokens, running)
            min_wait[q] = min(min_wait.get(q, math.inf), wait)
        elif q in min_wait and request.predicted_run_s < min_wait[q]:
            allowed.add(request.request_id)
    return frozenset(allowed)
