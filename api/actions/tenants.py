"""The operator's tenants, API keys and price plans (/v1/admin and the console's tenants page).

Every change runs in a write transaction (registry/db.py: SQLite BEGIN IMMEDIATE, retried on transient
errors), as uploads do: concurrent admin writes wait for each other instead of failing "database is locked".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.caches import forget_adapters, forget_key, forget_tenant
from api.pagination import page_response
from api.schemas import (
    ApiKeyCreated,
    ApiKeyRevoked,
    PageResponse,
    PricePlanCreate,
    PricePlanPublic,
    TenantCreate,
    TenantPublic,
    TenantUpdate,
)
from api.services import Services
from registry import api_keys, repository
from registry.account_pages import price_plan_page, tenant_page
from registry.db import is_insert_conflict, is_transient_error, run_in_write_transaction
from registry.errors import ConflictError
from registry.pages import PageRequest

T = TypeVar("T")


def _write(
    session: Session,
    work: Callable[[Session], T],
    is_retryable: Callable[[BaseException], bool] = is_transient_error,
) -> T:
    """Run one admin change in its own write transaction and commit it."""
    session.commit()  # end anything this request read so far: the change starts a transaction of its own
    return run_in_write_transaction(session, work, is_retryable=is_retryable)


def create_tenant(body: TenantCreate, session: Session) -> TenantPublic:
    """Create an active tenant (in its own prefix-cache namespace unless `prefix_cache_namespace` names a shared
    one)."""
    tenant = _write(
        session,
        lambda s: repository.create_tenant(
            s, body.name, plan_id=body.plan_id, prefix_cache_namespace=body.prefix_cache_namespace
        ),
    )
    return TenantPublic.model_validate(tenant)


def list_tenants(session: Session, page: PageRequest) -> PageResponse:
    """A page of the tenants, oldest first."""
    found = tenant_page(session, page)
    return page_response([TenantPublic.model_validate(t) for t in found.items], found.has_more)


def update_tenant(tenant_id: str, body: TenantUpdate, session: Session, services: Services) -> TenantPublic:
    """Change the fields sent (is_active, can_manage_keys, plan, prefix-cache namespace); forget the cached auth
    of the tenant and, when it was enabled or disabled, its adapters (other replicas: within their TTLs)."""
    changes = body.model_dump(include=body.model_fields_set)
    tenant = _write(session, lambda s: repository.update_tenant(s, tenant_id, **changes))
    forget_tenant(services.auth_cache, tenant_id)
    if "is_active" in changes:
        owned = {adapter.id for adapter in repository.list_own_adapters(session, tenant_id)}
        forget_adapters(services.model_cache, owned)
    return TenantPublic.model_validate(tenant)


def create_tenant_key(tenant_id: str, session: Session, services: Services) -> ApiKeyCreated:
    """Create an API key for the tenant (shown once); ConflictError when it holds
    settings.api.max_keys_per_tenant live keys, NotFoundError for an unknown tenant."""
    max_live_keys = services.settings.api.max_keys_per_tenant
    row, key = _write(session, lambda s: api_keys.create_api_key(s, tenant_id, max_live_keys=max_live_keys))
    return ApiKeyCreated(id=row.id, tenant_id=row.tenant_id, key=key, created_at=row.created_at)


def revoke_key(key_id: str, session: Session, services: Services) -> ApiKeyRevoked:
    """Revoke any API key: at once on this API process, within settings.api.auth_cache_ttl_s on the others."""
    row = _write(session, lambda s: api_keys.revoke_api_key(s, key_id))
    forget_key(services.auth_cache, key_id)
    return ApiKeyRevoked(id=row.id, tenant_id=row.tenant_id, revoked_at=row.revoked_at)


def create_plan(body: PricePlanCreate, session: Session) -> PricePlanPublic:
    """Create a price plan; ConflictError when the name is taken."""
    values = body.model_dump()
    try:
        plan = _write(session, lambda s: repository.create_price_plan(s, **values), is_insert_conflict)
    except IntegrityError:  # lost every retry to concurrent inserts of the same name
        raise ConflictError(f"a price plan named {body.name!r} exists already: choose another name") from None
    return PricePlanPublic.model_validate(plan)


def list_plans(session: Session, page: PageRequest) -> PageResponse:
    """A page of the price plans, by name."""
    found = price_plan_page(session, page)
    return page_response([PricePlanPublic.model_validate(p) for p in found.items], found.has_more)
