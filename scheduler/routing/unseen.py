"""Requests a worker's view does not show yet: the router's local correction for stale views. Pure.

A router reads each worker's load from its last published state (`WorkerView`), which the API reads from a
heartbeat up to `worker.heartbeat_interval_s` old and reuses for `routing.worker_view_cache_s`. Every
least-loaded policy picks the same worker for every request in that window (herding): a burst of N requests
lands on one worker while the others idle. The remedy here is the one every policy can use unchanged: the
caller (the API, api/routed_since_view.py) counts the requests it routed to each worker since that worker's
view was published (less those already finished), and the router sees them as queued there
(`with_unseen`), so each routed request raises that worker's load by one request per batch slot and the next
request of the burst goes to the next least-loaded worker. Power of two choices (a random pair, the less
loaded) also avoids herding but gives up the policy's ordering (rank fit, residency) for half the decisions,
and with a count the choice stays deterministic.

The count is an optimistic estimate: requests of other API replicas are not in it (each replica corrects its
own herd), and a request routed just before a heartbeat that did not yet include it drops out of the count
when that heartbeat's view arrives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from scheduler.routing.router import WorkerView


@dataclass(frozen=True)
class UnseenRequests:
    """Requests routed to one worker that its view does not show: how many, their prompt tokens, one LoRA rank
    per request (0 = base model) and how many per tenant id (requests of no known tenant are not listed)."""

    num_requests: int = 0
    num_prompt_tokens: int = 0
    ranks: tuple[int, ...] = ()
    num_by_tenant: Mapping[str, int] = field(default_factory=dict)


def with_unseen(view: WorkerView, unseen: UnseenRequests) -> WorkerView:
    """`view` with the unseen requests counted as queued there: `num_waiting`, `waiting_ranks` and
    `num_waiting_prompt_tokens` grow by them. Per-tenant queues grow only where the view publishes them (or
    has no queue at all): a view without them counts every queued request for every tenant (`tenant_load`),
    and adding ours alone would make its other queued requests invisible."""
    if unseen.num_requests <= 0:
        return view
    by_tenant = view.num_waiting_by_tenant
    if by_tenant or view.num_waiting == 0:
        merged = dict(by_tenant)
        for tenant_id, num in unseen.num_by_tenant.items():
            merged[tenant_id] = merged.get(tenant_id, 0) + num
        by_tenant = merged
    return replace(
        view,
        num_waiting=view.num_waiting + unseen.num_requests,
        waiting_ranks=view.waiting_ranks + unseen.ranks,
        num_waiting_prompt_tokens=view.num_waiting_prompt_tokens + unseen.num_prompt_tokens,
        num_waiting_by_tenant=by_tenant,
    )
