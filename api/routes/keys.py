"""/v1/keys: a tenant's own API keys. Listing is always allowed; creating and revoking only when the operator
let the tenant manage its keys (tenants.can_manage_keys: PATCH /v1/admin/tenants/{id}), else 403. A key is
shown once, in the creation's answer; another tenant's key id is a 404, like one that does not exist."""

from __future__ import annotations

from fastapi import APIRouter

from api.caches import forget_key
from api.deps import CurrentTenant, ServicesDep, SessionDep
from api.errors import ApiError
from api.request_text import TextCheckedRoute
from api.schemas import ApiKeyCreated, ApiKeyPublic, ApiKeyRevoked, ListResponse
from registry import api_keys
from registry.db import run_in_write_transaction
from registry.models import Tenant

router = APIRouter(prefix="/v1/keys", tags=["keys"], route_class=TextCheckedRoute)
KEYS_MANAGED_BY_OPERATOR = "your operator manages your API keys: ask them for a new key or a revocation"


def _require_key_management(tenant: Tenant) -> str:
    if not tenant.can_manage_keys:
        raise ApiError(403, "permission_error", KEYS_MANAGED_BY_OPERATOR)
    return tenant.id


@router.get("", response_model=ListResponse)
def list_keys(tenant: CurrentTenant, session: SessionDep) -> ListResponse:
    """The tenant's keys, newest first, revoked ones included (ids and dates only)."""
    return ListResponse(
        data=[ApiKeyPublic.model_validate(k) for k in api_keys.list_api_keys(session, tenant.id)]
    )


@router.post("", status_code=201, response_model=ApiKeyCreated)
def create_key(tenant: CurrentTenant, session: SessionDep) -> ApiKeyCreated:
    """Create a key for the calling tenant; the answer is the only time the key is shown."""
    tenant_id = _require_key_management(tenant)
    session.commit()  # end the auth read: the change runs in a write transaction of its own
    row, key = run_in_write_transaction(session, lambda s: api_keys.create_api_key(s, tenant_id))
    return ApiKeyCreated(id=row.id, tenant_id=row.tenant_id, key=key, created_at=row.created_at)


@router.delete("/{key_id}", response_model=ApiKeyRevoked)
def revoke_key(
    key_id: str, tenant: CurrentTenant, session: SessionDep, services: ServicesDep
) -> ApiKeyRevoked:
    """Revoke one of the tenant's keys (this very key too): at once here, within settings.api.auth_cache_ttl_s
    on the other API replicas."""
    tenant_id = _require_key_management(tenant)
    session.commit()
    row = run_in_write_transaction(session, lambda s: api_keys.revoke_own_api_key(s, tenant_id, key_id))
    forget_key(services.auth_cache, key_id)
    return ApiKeyRevoked(id=row.id, tenant_id=row.tenant_id, revoked_at=row.revoked_at)
