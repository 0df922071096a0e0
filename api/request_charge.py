"""What counts against a tenant's `requests_per_min` (the plan's request budget, api/ratelimit.py).

Charged once per request that arrives, whatever then becomes of it (a 400 for a bad body, a 404 for an unknown
model, a 403 or 429 on a later limit): every authenticated inference request (api/inference/prepare.py) and
every `/v1/keys` call (api/routes/keys.py; the console's keys page calls the same handlers). A request refused
by `requests_per_min` itself consumes nothing, so a client that backs off is admitted again when the window rolls
over.

An inference request is charged with its tokens in one check when it is admitted (`admit_async`: one round trip
to Redis, not two) or, when it fails or is abandoned before that, alone as it fails (`charged_once`); a failure
whose charge is refused answers the 429 instead, as if it had been refused on arrival. A tenant whose budget this
process has already seen spent in the window is refused on arrival without a round trip (`known_refusal`), so
its requests over the budget cost no parsing or tokenizing.

Not charged: reads of the tenant's own listings (GET /v1/adapters, /v1/models, /v1/usage: what an SDK calls
on start, which should not spend the inference budget) and uploads, which have their own `uploads_per_min`
(api/upload_rate.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from api.errors import ApiError
from api.ratelimit import RateDecision, RateLimiter, RateLimits


@dataclass
class ArrivalCharge:
    """One inference request's charge to requests_per_min, taken exactly once (`is_charged` once taken)."""

    limiter: RateLimiter
    tenant_id: str
    max_requests_per_min: int | None
    is_charged: bool = False

    async def charge_alone(self) -> RateDecision:
        """Charge the request without tokens, unless it already is (the charge of a request that fails before
        its admission, or whose admission refused it before charging it)."""
        if self.is_charged or self.max_requests_per_min is None:
            return RateDecision(True)
        decision = await self.limiter.acquire_async(
            self.tenant_id, 0, RateLimits(max_requests_per_min=self.max_requests_per_min)
        )
        self.is_charged = True  # charged, or refused by the budget itself (which consumes nothing)
        return decision


@asynccontextmanager
async def charged_once(
    limiter: RateLimiter, tenant_id: str, max_requests_per_min: int | None
) -> AsyncIterator[ArrivalCharge]:
    """The scope of an inference request from its arrival to its admission (which charges it with its tokens and
    sets `is_charged`): 429 at once when this process knows the budget spent; a failure inside is charged alone
    on its way out, and answered 429 instead when that charge is refused; a cancelled request (its client left)
    is charged too."""
    refuse_unless_allowed(limiter.known_refusal(tenant_id, max_requests_per_min))
    charge = ArrivalCharge(limiter, tenant_id, max_requests_per_min)
    try:
        yield charge
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await charge.charge_alone()  # its outcome answers nobody: the client is gone
        raise
    except Exception:
        refuse_unless_allowed(await charge.charge_alone())
        raise


def charge_request(limiter: RateLimiter, tenant_id: str, max_requests_per_min: int | None) -> None:
    """Count one request against the tenant's requests_per_min (None: unlimited, nothing to count); 429 with
    Retry-After when the budget is spent."""
    if max_requests_per_min is None:
        return
    refuse_unless_allowed(
        limiter.acquire(tenant_id, 0, RateLimits(max_requests_per_min=max_requests_per_min))
    )


def refuse_unless_allowed(decision: RateDecision | None) -> None:
    """429 naming the limit, with Retry-After, for a refused decision (None: nothing refused)."""
    if decision is not None and not decision.is_allowed:
        raise ApiError(
            429, "rate_limited", decision.reason, headers={"Retry-After": str(decision.retry_after_s)}
        )
