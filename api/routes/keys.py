"""/v1/keys: a tenant's own API keys. Listing is always allowed; creating and revoking only when the operator
let the tenant manage its keys (tenants.can_manage_keys: PATCH /v1/admin/tenants/{id}), else 403. A key is
shown once, in the creation's answer; another tenant's key id is a 404, like one that does not exist.

Every call counts against the tenant's requests_per_min on arrival (api/request_charge.py; 429 + Retry-After
beyond it). A tenant holds at most settings.api.max_keys_per_tenant live keys (409 `key_limit_reached`: revoke
one first) and cannot revoke its last live key (409 `last_live_key`: create another first), see
registry/api_keys.py."""

from __future__ import annotations

from fastapi import APIRouter

from api.caches import forget_key
from api.deps import CurrentTenant, ServicesDep, SessionDep
from api.errors import ApiError
from api.request_charge import charge_request
from api.request_text import TextCheckedRoute
from api.schemas import ApiKeyCreated, ApiKeyPublic, ApiKeyRevoked, ListResponse
from api.services import Services
from registry import api_keys
from registry.db import run_in_write_transaction
from registry.models import Tenant

router = APIRouter(prefix="/v1/keys", tags=["keys"], route_class=TextCheckedRoute)
KEYS_MANAGED_BY_OPERATOR = "your operator manages your API keys: ask them for a new key or a revocation"


def charge_key_call(services: Services, tenant: Tenant) -> None:
    """Count a /v1/keys call against the tenant's requests_per_min (429 when its budget is spent)."""
    max_requests = tenant.plan.requests_per_min if tenant.plan is not None else None
    charge_request(services.rate_limiter, tenant.id, max_requests)


def _require_key_management(tenant: Tenant) -> str:
    if not tenant.can_manage_keys:
        raise ApiError(403, "permission_error", KEYS_MANAGED_BY_OPERATOR)
    return tenant.id


@router.get("", response_model=ListResponse)
def list_keys(tenant: CurrentTenant, session: SessionDep, services: ServicesDep) -> ListResponse:
    """The tenant's keys, newest first, revoked ones included (ids and dates only)."""
    charge_key_call(services, tenant)
    return ListResponse(
        data=[ApiKeyPublic.model_validate(k) for k in api_keys.list_api_keys(session, tenant.id)]
    )


@router.post("", status_code=201, response_model=ApiKeyCreated)
def create_key(tenant: CurrentTenant, session: SessionDep, services: ServicesDep) -> ApiKeyCreated:
    """Create a key for the calling tenant; the answer is the only time the key is shown."""
    charge_key_call(services, tenant)
    tenant_id = _require_key_management(tenant)
    max_live_keys = services.settings.api.max_keys_per_tenant
    session.commit()  # end the auth read: the change runs in a write transaction of its own
    row, key = run_in_write_transaction(
        session, lambda s: api_keys.create_api_key(s, tenant_id, max_live_keys=max_live_keys)
    )
    return ApiKeyCreated(id=row.id, tenant_id=row.tenant_id, key=key, created_at=row.created_at)


@router.delete("/{key_id}", response_model=ApiKeyRevoked)
def revoke_key(
    key_id: str, tenant: CurrentTenant, session: SessionDep, services: ServicesDep
) -> ApiKeyRevoked:
    """Revoke one of the tenant's keys (this very key too, unless it is the last live one): at once here, within
    settings.api.auth_cache_ttl_s on the other API replicas."""
    charge_key_call(services, tenant)
    tenant_id = _require_key_management(tenant)
    session.commit()
    row = run_in_write_transaction(session, lambda s: api_keys.revoke_own_api_key(s, tenant_id, key_id))
    forget_key(services.auth_cache, key_id)
    return ApiKeyRevoked(id=row.id, tenant_id=row.tenant_id, revoked_at=row.revoked_at)
