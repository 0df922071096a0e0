"""A tenant's API keys in the console: listed always; created and revoked only when the operator allows it
(tenants.can_manage_keys). A new key is shown once, on the page that created it. Revoking the key the session
signed in with ends the session."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from api.caches import forget_key
from api.console.auth import ConsoleForbidden, ConsoleTenant, ConsoleUser, CsrfChecked
from api.console.security import ConsoleRoute
from api.console.templating import render
from api.deps import ServicesDep, SessionDep
from registry import api_keys
from registry.db import run_in_write_transaction

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)


def _require_key_management(user: ConsoleUser) -> str:
    if not user.can_manage_keys:
        raise ConsoleForbidden("your operator manages your API keys: ask them for a new key or a revocation")
    return user.tenant_id or ""


def _keys_page(request: Request, user: ConsoleUser, db: SessionDep, new_key: str | None = None) -> Response:
    keys = api_keys.list_api_keys(db, user.tenant_id or "")
    return render(request, "keys.html", user, keys=keys, new_key=new_key)


@router.get("/keys", response_class=HTMLResponse)
def keys_page(request: Request, user: ConsoleTenant, db: SessionDep) -> Response:
    """The tenant's keys (ids and dates; a key itself is never shown again)."""
    return _keys_page(request, user, db)


@router.post("/keys", response_class=HTMLResponse)
def create_key(request: Request, _: CsrfChecked, user: ConsoleTenant, db: SessionDep) -> Response:
    """Create a key and show it once."""
    tenant_id = _require_key_management(user)
    db.commit()  # end the session check's read: the change runs in a write transaction of its own
    key = run_in_write_transaction(db, lambda s: api_keys.create_api_key(s, tenant_id))[1]
    return _keys_page(request, user, db, new_key=key)


@router.post("/keys/{key_id}/revoke", response_class=HTMLResponse)
def revoke_key(
    key_id: str, request: Request, _: CsrfChecked, user: ConsoleTenant, db: SessionDep, services: ServicesDep
) -> Response:
    """Revoke one of the tenant's own keys (another tenant's key id is a 404)."""
    tenant_id = _require_key_management(user)
    db.commit()
    run_in_write_transaction(db, lambda s: api_keys.revoke_own_api_key(s, tenant_id, key_id))
    forget_key(services.auth_cache, key_id)
    return _keys_page(request, user, db)
