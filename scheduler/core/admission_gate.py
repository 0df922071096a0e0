"""Which planned requests the batch scheduler still tries after some did not fit (one step's admission).

An `AdmissionPlan` says how a request that does not fit for lack of memory affects the later ones:
- no head-of-line blocking (SJF): it affects nobody;
- head-of-line blocking, no groups (FIFO): nobody after it is tried (`is_closed`);
- head-of-line blocking with groups (the multi-queue policy's queues): only later requests of its own group
  are skipped; when it failed for its adapter's device memory (not for KV blocks), the group's requests in
  `bypass_ids` are still tried;
- a request in `barrier_ids` whose KV does not fit closes the plan, groups or not; so does one in
  `adapter_barrier_ids` (a subset) whose adapter finds no device memory.
"""

from __future__ import annotations

from scheduler.admission.admission import AdmissionPlan


class AdmissionGate:
    """Tracks blocked groups over one pass through a plan."""

    def __init__(self, plan: AdmissionPlan) -> None:
        self.plan = plan
        self._group_of = dict(zip(plan.request_ids, plan.group_ids, strict=True)) if plan.group_ids else {}
        self._blocked: set[int] = set()  # groups whose later requests are all skipped
        self._adapter_blocked: set[int] = (
            set()
        )  # groups whose later requests are skipped unless in bypass_ids
        self.is_closed = False  # no request after this point is tried

    def may_try(self, request_id: str) -> bool:
        """False when an earlier failure in its group (or in the whole plan) rules the request out."""
        if self.is_closed:
            return False
        group = self._group_of.get(request_id)
        if group is None or group not in (self._blocked | self._adapter_blocked):
            return True
        return group not in self._blocked and request_id in self.plan.bypass_ids

    def on_short(self, request_id: str, is_adapter_short: bool) -> None:
        """The request did not fit: its adapter found no device memory (is_adapter_short) or its KV did not."""
        if request_id in self.plan.barrier_ids and (
            not is_adapter_short or request_id in self.plan.adapter_barrier_ids
        ):
            self.is_closed = True
            return
        if not self.plan.is_head_of_line_blocking:
            return
        group = self._group_of.get(request_id)
        if group is None:
            self.is_closed = True
        elif is_adapter_short and group not in self._adapter_blocked:
            self._adapter_blocked.add(group)
        else:
            self._blocked.add(group)
