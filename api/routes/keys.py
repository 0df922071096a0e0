"""/v1/keys: a tenant's own API keys. Listing is always allowed; creating and revoking only when the operator
let the tenant manage its keys (tenants.can_manage_keys: PATCH /v1/admin/tenants/{id}), else 403. A key is
shown once, in the creation's answer; another tenant's key id is a 404, like one that does not exist.

Every call counts against the tenant's requests_per_min on arrival (api/request_charge.py; 429 + Retry-After
beyond it). A tenant holds at most settings.api.max_keys_per_tenant live keys (409 `key_limit_reached`: revoke
one first) and cannot revoke its last live key (409 `last_live_key`: create another first), see
registry/api_keys.py. The work: api/actions/keys.py."""

from __future__ import annotations

from fastapi import APIRouter

from api.actions import keys
from api.deps import CurrentTenant, ServicesDep, SessionDep
from api.pagination import PageDep
from api.request_text import TextCheckedRoute
from api.schemas import ApiKeyCreated, ApiKeyRevoked, PageResponse

router = APIRouter(prefix="/v1/keys", tags=["keys"], route_class=TextCheckedRoute)


@router.get("", response_model=PageResponse)
def list_keys(
    tenant: CurrentTenant, session: SessionDep, services: ServicesDep, page: PageDep
) -> PageResponse:
    """The tenant's keys, newest first, revoked ones included (ids and dates only), a page at a time: `limit`
    (1-1000, default 100) and `after` (the previous page's `last_id`)."""
    return keys.list_own_keys(tenant, session, services, page)


@router.post("", status_code=201, response_model=ApiKeyCreated)
def create_key(tenant: CurrentTenant, session: SessionDep, services: ServicesDep) -> ApiKeyCreated:
    """Create a key for the calling tenant; the answer is the only time the key is shown."""
    return keys.create_own_key(tenant, session, services)


@router.delete("/{key_id}", response_model=ApiKeyRevoked)
def revoke_key(
    key_id: str, tenant: CurrentTenant, session: SessionDep, services: ServicesDep
) -> ApiKeyRevoked:
    """Revoke one of the tenant's keys (this very key too, unless it is the last live one): at once here, within
    settings.api.auth_cache_ttl_s on the other API replicas."""
    return keys.revoke_own_key(key_id, tenant, session, services)
