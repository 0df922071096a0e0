"""/v1/admin: tenants, API keys and price plans (admin key only).

Every change runs in a write transaction (registry/db.py: SQLite BEGIN IMMEDIATE, retried on transient
errors), as uploads do: concurrent admin writes wait for each other instead of failing "database is locked".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import APIRouter, Path
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.caches import forget_adapters, forget_key, forget_tenant
from api.deps import AdminDep, ServicesDep, SessionDep
from api.request_text import TextCheckedRoute
from api.schemas import (
    PRINTABLE_TEXT,
    ApiKeyCreated,
    ApiKeyRevoked,
    ListResponse,
    PricePlanCreate,
    PricePlanPublic,
    TenantCreate,
    TenantPublic,
    TenantUpdate,
)
from registry import api_keys, repository
from registry.db import is_insert_conflict, is_transient_error, run_in_write_transaction
from registry.errors import ConflictError
from registry.models import PricePlan

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=TextCheckedRoute)
T = TypeVar("T")
PathId = Annotated[
    str, Path(pattern=PRINTABLE_TEXT)
]  # an unknown id is a 404; a NUL byte would be a DB error


def _write(
    session: Session,
    work: Callable[[Session], T],
    is_retryable: Callable[[BaseException], bool] = is_transient_error,
) -> T:
    """Run one admin change in its own write transaction and commit it."""
    session.commit()  # end anything this request read so far: the change starts a transaction of its own
    return run_in_write_transaction(session, work, is_retryable=is_retryable)


@router.post("/tenants", status_code=201, response_model=TenantPublic)
def create_tenant(body: TenantCreate, _: AdminDep, session: SessionDep) -> TenantPublic:
    """Create an active tenant (in its own prefix-cache namespace unless `prefix_cache_namespace` names a shared
    one)."""
    tenant = _write(
        session,
        lambda s: repository.create_tenant(
            s, body.name, plan_id=body.plan_id, prefix_cache_namespace=body.prefix_cache_namespace
        ),
    )
    return TenantPublic.model_validate(tenant)


@router.get("/tenants", response_model=ListResponse)
def list_tenants(_: AdminDep, session: SessionDep) -> ListResponse:
    """All tenants."""
    return ListResponse(data=[TenantPublic.model_validate(t) for t in repository.list_tenants(session)])


@router.patch("/tenants/{tenant_id}", response_model=TenantPublic)
def update_tenant(
    tenant_id: PathId, body: TenantUpdate, _: AdminDep, session: SessionDep, services: ServicesDep
) -> TenantPublic:
    """Disable/enable a tenant, change its plan or its prefix-cache namespace (only the fields sent change).

    A disabled tenant's keys stop working and its public adapters are hidden from other tenants. Applies at
    once on this API process; other replicas see it within settings.api.auth_cache_ttl_s (keys) and
    settings.api.model_cache_ttl_s (adapters)."""
    changes = body.model_dump(include=body.model_fields_set)
    tenant = _write(session, lambda s: repository.update_tenant(s, tenant_id, **changes))
    forget_tenant(services.auth_cache, tenant_id)
    if "is_active" in changes:
        owned = {adapter.id for adapter in repository.list_own_adapters(session, tenant_id)}
        forget_adapters(services.model_cache, owned)
    return TenantPublic.model_validate(tenant)


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=ApiKeyCreated)
def create_key(tenant_id: PathId, _: AdminDep, session: SessionDep, services: ServicesDep) -> ApiKeyCreated:
    """Create an API key; the response is the only time the key is shown. 409 when the tenant already holds
    settings.api.max_keys_per_tenant live keys (revoke one first)."""
    max_live_keys = services.settings.api.max_keys_per_tenant
    row, key = _write(session, lambda s: api_keys.create_api_key(s, tenant_id, max_live_keys=max_live_keys))
    return ApiKeyCreated(id=row.id, tenant_id=row.tenant_id, key=key, created_at=row.created_at)


@router.delete("/keys/{key_id}", response_model=ApiKeyRevoked)
def revoke_key(key_id: PathId, _: AdminDep, session: SessionDep, services: ServicesDep) -> ApiKeyRevoked:
    """Revoke an API key: it stops authenticating at once on this API process and within
    settings.api.auth_cache_ttl_s on the other replicas (their in-process auth caches)."""
    row = _write(session, lambda s: api_keys.revoke_api_key(s, key_id))
    forget_key(services.auth_cache, key_id)
    return ApiKeyRevoked(id=row.id, tenant_id=row.tenant_id, revoked_at=row.revoked_at)


@router.post("/plans", status_code=201, response_model=PricePlanPublic)
def create_plan(body: PricePlanCreate, _: AdminDep, session: SessionDep) -> PricePlanPublic:
    """Create a price plan (prices, rate limits, upload quotas, SLO targets); 409 when the name is taken."""
    values = body.model_dump()
    try:
        plan = _write(session, lambda s: repository.create_price_plan(s, **values), is_insert_conflict)
    except IntegrityError:  # lost every retry to concurrent inserts of the same name
        raise ConflictError(f"a price plan named {body.name!r} exists already: choose another name") from None
    return PricePlanPublic.model_validate(plan)


@router.get("/plans", response_model=ListResponse)
def list_plans(_: AdminDep, session: SessionDep) -> ListResponse:
    """All price plans."""
    plans = session.query(PricePlan).order_by(PricePlan.name).all()
    return ListResponse(data=[PricePlanPublic.model_validate(p) for p in plans])
