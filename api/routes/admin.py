"""/v1/admin: tenants, API keys and price plans (admin key only). The work: api/actions/tenants.py (each change
in its own write transaction)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api.actions import tenants
from api.deps import AdminDep, ServicesDep, SessionDep
from api.pagination import PageDep
from api.request_text import TextCheckedRoute
from api.schemas import (
    PRINTABLE_TEXT,
    ApiKeyCreated,
    ApiKeyRevoked,
    PageResponse,
    PricePlanCreate,
    PricePlanPublic,
    TenantCreate,
    TenantPublic,
    TenantUpdate,
)

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=TextCheckedRoute)
PathId = Annotated[
    str, Path(pattern=PRINTABLE_TEXT)
]  # an unknown id is a 404; a NUL byte would be a DB error


@router.post("/tenants", status_code=201, response_model=TenantPublic)
def create_tenant(body: TenantCreate, _: AdminDep, session: SessionDep) -> TenantPublic:
    """Create an active tenant (in its own prefix-cache namespace unless `prefix_cache_namespace` names a shared
    one)."""
    return tenants.create_tenant(body, session)


@router.get("/tenants", response_model=PageResponse)
def list_tenants(_: AdminDep, session: SessionDep, page: PageDep) -> PageResponse:
    """All tenants, oldest first, a page at a time: `limit` (1-1000, default 100) and `after` (the previous
    page's `last_id`)."""
    return tenants.list_tenants(session, page)


@router.patch("/tenants/{tenant_id}", response_model=TenantPublic)
def update_tenant(
    tenant_id: PathId, body: TenantUpdate, _: AdminDep, session: SessionDep, services: ServicesDep
) -> TenantPublic:
    """Disable/enable a tenant, change its plan or its prefix-cache namespace (only the fields sent change).

    A disabled tenant's keys stop working and its public adapters are hidden from other tenants. Applies at
    once on this API process; other replicas see it within settings.api.auth_cache_ttl_s (keys) and
    settings.api.model_cache_ttl_s (adapters)."""
    return tenants.update_tenant(tenant_id, body, session, services)


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=ApiKeyCreated)
def create_key(tenant_id: PathId, _: AdminDep, session: SessionDep, services: ServicesDep) -> ApiKeyCreated:
    """Create an API key; the response is the only time the key is shown. 409 when the tenant already holds
    settings.api.max_keys_per_tenant live keys (revoke one first)."""
    return tenants.create_tenant_key(tenant_id, session, services)


@router.delete("/keys/{key_id}", response_model=ApiKeyRevoked)
def revoke_key(key_id: PathId, _: AdminDep, session: SessionDep, services: ServicesDep) -> ApiKeyRevoked:
    """Revoke an API key: it stops authenticating at once on this API process and within
    settings.api.auth_cache_ttl_s on the other replicas (their in-process auth caches)."""
    return tenants.revoke_key(key_id, session, services)


@router.post("/plans", status_code=201, response_model=PricePlanPublic)
def create_plan(body: PricePlanCreate, _: AdminDep, session: SessionDep) -> PricePlanPublic:
    """Create a price plan (prices, rate limits, upload quotas, SLO targets); 409 when the name is taken."""
    return tenants.create_plan(body, session)


@router.get("/plans", response_model=PageResponse)
def list_plans(_: AdminDep, session: SessionDep, page: PageDep) -> PageResponse:
    """All price plans, by name, a page at a time: `limit` (1-1000, default 100) and `after` (the previous
    page's `last_id`)."""
    return tenants.list_plans(session, page)
