"""Request dependencies as Annotated aliases: SessionDep, CurrentTenant, InferenceTenant, AdminDep,
MetricsAccessDep, BlobStoreDep, ServicesDep.

Trivial dependencies are `async def` so they run on the event loop (a sync one costs a threadpool hop).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from functools import partial
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.caches import TenantAuth, key_digest, stale_on_outage
from api.errors import DATABASE_ERRORS, ApiError
from api.plan_limits import SamplingLimits
from api.ratelimit import RateLimits
from api.services import Services
from registry import api_keys, keys
from registry.models import ApiKey, Tenant
from registry.storage import BlobStore
from settings import Settings

bearer_scheme = HTTPBearer(
    auto_error=False, description="Tenant key (lh_...) or, on /v1/admin, the admin key"
)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


async def get_services(request: Request) -> Services:
    """The app's services (built in the lifespan)."""
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_settings(services: ServicesDep) -> Settings:
    """The app's settings."""
    return services.settings


def get_session(services: ServicesDep) -> Iterator[Session]:
    """One DB session per request; routes commit what they change."""
    with services.session_factory() as session:
        yield session


async def get_blob_store(services: ServicesDep) -> BlobStore:
    """The adapter blob store."""
    return services.blob_store


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
BlobStoreDep = Annotated[BlobStore, Depends(get_blob_store)]


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "authentication_error", message, headers={"WWW-Authenticate": "Bearer"})


def get_current_tenant(session: SessionDep, credentials: BearerDep) -> Tenant:
    """The active tenant owning the bearer key; 401 for a missing/invalid/revoked key, 403 if disabled."""
    if credentials is None:
        raise _unauthorized("missing API key: send 'Authorization: Bearer <your lh_... key>'")
    row = api_keys.find_api_key(session, credentials.credentials)
    if row is None:
        raise _unauthorized("invalid or revoked API key: ask your operator for a new key")
    if not row.tenant.is_active:
        raise ApiError(
            403, "tenant_disabled", "this tenant is disabled; contact the operator to re-enable it"
        )
    return row.tenant


async def get_inference_tenant(services: ServicesDep, credentials: BearerDep) -> TenantAuth:
    """CurrentTenant for the inference hot path: served from the auth cache (api/caches.py), the DB read in
    a thread only on a miss. Same 401/403 answers as get_current_tenant."""
    if credentials is None:
        raise _unauthorized("missing API key: send 'Authorization: Bearer <your lh_... key>'")
    cache = services.auth_cache
    digest = key_digest(credentials.credentials)
    try:  # the cache, read through (reloaded in the background before it expires: api/caches.py)
        auth = await cache.load(
            digest, partial(run_in_threadpool, _load_tenant_auth, services, credentials.credentials)
        )
    except DATABASE_ERRORS as exc:
        auth = stale_on_outage(cache, digest, exc)
    if auth is None:
        raise _unauthorized("invalid or revoked API key: ask your operator for a new key")
    if not auth.is_active:
        raise ApiError(
            403, "tenant_disabled", "this tenant is disabled; contact the operator to re-enable it"
        )
    return auth


def _load_tenant_auth(services: Services, presented: str) -> TenantAuth | None:
    with services.session_factory() as session:
        row = api_keys.find_api_key(session, presented)
        return None if row is None else tenant_auth_of(row)


def tenant_auth_of(row: ApiKey) -> TenantAuth:
    """What the inference path needs of a verified key's tenant and plan."""
    tenant, plan = row.tenant, row.tenant.plan
    limits = (
        RateLimits(plan.requests_per_min, plan.tokens_per_min, plan.max_concurrent_requests)
        if plan
        else RateLimits()
    )
    weight = plan.fair_share_weight if plan and plan.fair_share_weight is not None else 1.0
    return TenantAuth(
        tenant_id=tenant.id,
        key_id=row.id,
        is_active=tenant.is_active,
        limits=limits,
        fair_share_weight=weight,
        shared_cache_namespace=tenant.prefix_cache_namespace,
        sampling_limits=SamplingLimits.of_plan(plan.max_n, plan.max_top_logprobs)
        if plan
        else SamplingLimits(),
    )


def require_admin(services: ServicesDep, credentials: BearerDep) -> None:
    """Accept only the admin key (compared in constant time)."""
    if credentials is None:
        raise _unauthorized("missing admin key: send 'Authorization: Bearer <admin key>'")
    is_admin = keys.verify_admin_key(
        credentials.credentials,
        admin_key=services.settings.api.admin_key,
        admin_key_hash=services.admin_key_hash,
    )
    if not is_admin:
        raise _unauthorized("this route needs the admin key (tenant keys are not accepted)")


def require_metrics_access(services: ServicesDep, credentials: BearerDep) -> None:
    """/metrics names workers: it needs the admin key or settings.api.metrics_token, unless the operator made it
    public (settings.api.is_metrics_public)."""
    if services.settings.api.is_metrics_public:
        return
    if credentials is not None and _is_metrics_credential(services, credentials.credentials):
        return
    raise _unauthorized(
        "/metrics needs 'Authorization: Bearer <metrics token or admin key>' (the operator sets "
        "LORAHOST_METRICS_TOKEN for scrapers, or LORAHOST_IS_METRICS_PUBLIC=true)"
    )


def _is_metrics_credential(services: Services, presented: str) -> bool:
    """The metrics token (when set) or the admin key, compared in constant time."""
    token = services.settings.api.metrics_token
    if token and hmac.compare_digest(presented.encode(), token.encode()):
        return True
    return keys.verify_admin_key(
        presented, admin_key=services.settings.api.admin_key, admin_key_hash=services.admin_key_hash
    )


CurrentTenant = Annotated[Tenant, Depends(get_current_tenant)]
InferenceTenant = Annotated[TenantAuth, Depends(get_inference_tenant)]
AdminDep = Annotated[None, Depends(require_admin)]
MetricsAccessDep = Annotated[None, Depends(require_metrics_access)]
