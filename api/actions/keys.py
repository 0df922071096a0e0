"""A tenant's own API keys (/v1/keys and the console's keys page). Listing is always allowed; creating and
revoking only when the operator let the tenant manage its keys (tenants.can_manage_keys), else 403. Every call
counts against the tenant's requests_per_min (api/request_charge.py). Limits: registry/api_keys.py."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.caches import forget_key
from api.errors import ApiError
from api.pagination import page_response
from api.request_charge import charge_request
from api.schemas import ApiKeyCreated, ApiKeyPublic, ApiKeyRevoked, PageResponse
from api.services import Services
from registry import api_keys
from registry.account_pages import api_key_page
from registry.db import run_in_write_transaction
from registry.models import Tenant
from registry.pages import PageRequest

KEYS_MANAGED_BY_OPERATOR = "your operator manages your API keys: ask them for a new key or a revocation"


def charge_key_call(services: Services, tenant: Tenant) -> None:
    """Count a key call against the tenant's requests_per_min (429 when its budget is spent)."""
    max_requests = tenant.plan.requests_per_min if tenant.plan is not None else None
    charge_request(services.rate_limiter, tenant.id, max_requests)


def _require_key_management(tenant: Tenant) -> str:
    if not tenant.can_manage_keys:
        raise ApiError(403, "permission_error", KEYS_MANAGED_BY_OPERATOR)
    return tenant.id


def list_own_keys(tenant: Tenant, session: Session, services: Services, page: PageRequest) -> PageResponse:
    """A page of the tenant's keys, newest first, revoked ones included (ids and dates only)."""
    charge_key_call(services, tenant)
    found = api_key_page(session, tenant.id, page)
    return page_response([ApiKeyPublic.model_validate(k) for k in found.items], found.has_more)


def create_own_key(tenant: Tenant, session: Session, services: Services) -> ApiKeyCreated:
    """Create a key for the tenant; the answer is the only time the key is shown."""
    charge_key_call(services, tenant)
    tenant_id = _require_key_management(tenant)
    max_live_keys = services.settings.api.max_keys_per_tenant
    session.commit()  # end the auth read: the change runs in a write transaction of its own
    row, key = run_in_write_transaction(
        session, lambda s: api_keys.create_api_key(s, tenant_id, max_live_keys=max_live_keys)
    )
    return ApiKeyCreated(id=row.id, tenant_id=row.tenant_id, key=key, created_at=row.created_at)


def revoke_own_key(key_id: str, tenant: Tenant, session: Session, services: Services) -> ApiKeyRevoked:
    """Revoke one of the tenant's keys (at once here, within settings.api.auth_cache_ttl_s on the other API
    replicas); another tenant's key id is a 404."""
    charge_key_call(services, tenant)
    tenant_id = _require_key_management(tenant)
    session.commit()
    row = run_in_write_transaction(session, lambda s: api_keys.revoke_own_api_key(s, tenant_id, key_id))
    forget_key(services.auth_cache, key_id)
    return ApiKeyRevoked(id=row.id, tenant_id=row.tenant_id, revoked_at=row.revoked_at)
