"""/v1/admin: tenants, API keys and price plans (admin key only)."""

from __future__ import annotations

from fastapi import APIRouter

from api.caches import forget_adapters, forget_key, forget_tenant
from api.deps import AdminDep, ServicesDep, SessionDep
from api.schemas import (
    ApiKeyCreated,
    ApiKeyRevoked,
    ListResponse,
    PricePlanCreate,
    PricePlanPublic,
    TenantCreate,
    TenantPublic,
    TenantUpdate,
)
from registry import repository
from registry.models import PricePlan

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post("/tenants", status_code=201, response_model=TenantPublic)
def create_tenant(body: TenantCreate, _: AdminDep, session: SessionDep) -> TenantPublic:
    """Create an active tenant (in its own prefix-cache namespace unless `prefix_cache_namespace` names a shared
    one)."""
    tenant = repository.create_tenant(
        session, body.name, plan_id=body.plan_id, prefix_cache_namespace=body.prefix_cache_namespace
    )
    session.commit()
    return TenantPublic.model_validate(tenant)


@router.get("/tenants", response_model=ListResponse)
def list_tenants(_: AdminDep, session: SessionDep) -> ListResponse:
    """All tenants."""
    return ListResponse(data=[TenantPublic.model_validate(t) for t in repository.list_tenants(session)])


@router.patch("/tenants/{tenant_id}", response_model=TenantPublic)
def update_tenant(
    tenant_id: str, body: TenantUpdate, _: AdminDep, session: SessionDep, services: ServicesDep
) -> TenantPublic:
    """Disable/enable a tenant, change its plan or its prefix-cache namespace (only the fields sent change).

    A disabled tenant's keys stop working and its public adapters are hidden from other tenants. Applies at
    once on this API process; other replicas see it within settings.auth_cache_ttl_s (keys) and
    settings.model_cache_ttl_s (adapters)."""
    changes = body.model_dump(include=body.model_fields_set)
    tenant = repository.update_tenant(session, tenant_id, **changes)
    session.commit()
    forget_tenant(services.auth_cache, tenant_id)
    if "is_active" in changes:
        owned = {adapter.id for adapter in repository.list_own_adapters(session, tenant_id)}
        forget_adapters(services.model_cache, owned)
    return TenantPublic.model_validate(tenant)


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=ApiKeyCreated)
def create_key(tenant_id: str, _: AdminDep, session: SessionDep) -> ApiKeyCreated:
    """Create an API key; the response is the only time the key is shown."""
    row, key = repository.create_api_key(session, tenant_id)
    session.commit()
    return ApiKeyCreated(id=row.id, tenant_id=row.tenant_id, key=key, created_at=row.created_at)


@router.delete("/keys/{key_id}", response_model=ApiKeyRevoked)
def revoke_key(key_id: str, _: AdminDep, session: SessionDep, services: ServicesDep) -> ApiKeyRevoked:
    """Revoke an API key: it stops authenticating at once on this API process and within
    settings.auth_cache_ttl_s on the other replicas (their in-process auth caches)."""
    row = repository.revoke_api_key(session, key_id)
    session.commit()
    forget_key(services.auth_cache, key_id)
    return ApiKeyRevoked(id=row.id, tenant_id=row.tenant_id, revoked_at=row.revoked_at)


@router.post("/plans", status_code=201, response_model=PricePlanPublic)
def create_plan(body: PricePlanCreate, _: AdminDep, session: SessionDep) -> PricePlanPublic:
    """Create a price plan (prices, rate limits, SLO targets)."""
    plan = repository.create_price_plan(session, **body.model_dump())
    session.commit()
    return PricePlanPublic.model_validate(plan)


@router.get("/plans", response_model=ListResponse)
def list_plans(_: AdminDep, session: SessionDep) -> ListResponse:
    """All price plans."""
    plans = session.query(PricePlan).order_by(PricePlan.name).all()
    return ListResponse(data=[PricePlanPublic.model_validate(p) for p in plans])
