"""The upload rate quota (a plan's uploads_per_min) on the shared rate-limit machinery (api/ratelimit.py).

Uploads and imports are counted in a bucket of their own per tenant (`<tenant id>:uploads`), separate from
the tenant's inference requests/tokens, in Redis when configured (all API replicas share it) or in memory.
Every POST /v1/adapters is charged when it arrives, before its body is read, whether it is then accepted
or refused: validation is the expensive part an upload flood would buy.
"""

from __future__ import annotations

from api.errors import ApiError
from api.ratelimit import RateLimiter, RateLimits
from registry.upload_quota import UploadQuota


def upload_bucket(tenant_id: str) -> str:
    """The rate limiter's key for the tenant's uploads."""
    return f"{tenant_id}:uploads"


def admit_upload(rate_limiter: RateLimiter, tenant_id: str, quota: UploadQuota) -> None:
    """Charge one upload to the tenant's uploads_per_min; 429 with Retry-After when over it."""
    if quota.max_uploads_per_min is None:
        return
    limits = RateLimits(max_requests_per_min=quota.max_uploads_per_min)
    decision = rate_limiter.acquire(upload_bucket(tenant_id), 0, limits)
    if decision.is_allowed:
        return
    raise ApiError(
        429,
        "upload_rate_limited",
        f"plan {quota.plan_name!r} allows {quota.max_uploads_per_min} uploads per minute (uploads_per_min); "
        f"retry in {decision.retry_after_s} s, or ask the operator for a plan with a higher upload rate",
        headers={"Retry-After": str(decision.retry_after_s)},
    )
