"""What counts against a tenant's `requests_per_min` (the plan's request budget, api/ratelimit.py).

Charged on arrival, once per request, whatever then becomes of it (a 400 for a bad body, a 404 for an unknown
model, a 403 or 429 on a later limit): every authenticated inference request (api/inference/prepare.py; its
tokens are charged apart, once it is sized) and every `/v1/keys` call (api/routes/keys.py; the console's keys
page calls the same handlers). A request refused by `requests_per_min` itself consumes nothing, so a client that
backs off is admitted again when the window rolls over.

Not charged: reads of the tenant's own listings (GET /v1/adapters, /v1/models, /v1/usage: what an SDK calls
on start, which should not spend the inference budget) and uploads, which have their own `uploads_per_min`
(api/upload_rate.py).
"""

from __future__ import annotations

from api.errors import ApiError
from api.ratelimit import RateDecision, RateLimiter, RateLimits


def charge_request(limiter: RateLimiter, tenant_id: str, max_requests_per_min: int | None) -> None:
    """Count one request against the tenant's requests_per_min (None: unlimited, nothing to count); 429 with
    Retry-After when the budget is spent."""
    if max_requests_per_min is None:
        return
    refuse_unless_allowed(
        limiter.acquire(tenant_id, 0, RateLimits(max_requests_per_min=max_requests_per_min))
    )


async def charge_request_async(
    limiter: RateLimiter, tenant_id: str, max_requests_per_min: int | None
) -> None:
    """`charge_request` from the event loop (the inference path): neither blocks it nor hops to a thread."""
    if max_requests_per_min is None:
        return
    limits = RateLimits(max_requests_per_min=max_requests_per_min)
    refuse_unless_allowed(await limiter.acquire_async(tenant_id, 0, limits))


def refuse_unless_allowed(decision: RateDecision) -> None:
    """429 naming the limit, with Retry-After, for a refused decision."""
    if not decision.is_allowed:
        raise ApiError(
            429, "rate_limited", decision.reason, headers={"Retry-After": str(decision.retry_after_s)}
        )
