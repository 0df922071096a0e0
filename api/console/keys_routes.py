"""A tenant's API keys in the console: listed always; created and revoked only when the operator allows it
(tenants.can_manage_keys), through the actions of /v1/keys (api/actions/keys.py). A new key is shown once,
on the page that created it. Revoking the key the session signed in with ends the session."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.orm import Session

from api.actions import keys
from api.console.auth import ConsoleTenant, ConsoleUser, CsrfChecked, tenant_row
from api.console.pager import console_page_request, pager
from api.console.security import ConsoleRoute
from api.console.templating import render
from api.deps import ServicesDep, SessionDep
from registry.account_pages import api_key_page

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)


def _keys_page(
    request: Request, user: ConsoleUser, db: Session, new_key: str | None = None, after: str | None = None
) -> Response:
    wanted = console_page_request(after)
    page = api_key_page(db, user.tenant_id or "", wanted)
    return render(request, "keys.html", user, keys=page.items, new_key=new_key, **pager(page, wanted))


@router.get("/keys", response_class=HTMLResponse)
def keys_page(request: Request, user: ConsoleTenant, db: SessionDep, after: str | None = None) -> Response:
    """The tenant's keys, newest first, a page at a time (ids and dates; a key itself is never shown again)."""
    return _keys_page(request, user, db, after=after)


@router.post("/keys", response_class=HTMLResponse)
def create_key(
    request: Request, _: CsrfChecked, user: ConsoleTenant, db: SessionDep, services: ServicesDep
) -> Response:
    """Create a key (POST /v1/keys) and show it once."""
    created = keys.create_own_key(tenant_row(db, user), db, services)
    return _keys_page(request, user, db, new_key=created.key)


@router.post("/keys/{key_id}/revoke", response_class=HTMLResponse)
def revoke_key(
    key_id: str, request: Request, _: CsrfChecked, user: ConsoleTenant, db: SessionDep, services: ServicesDep
) -> Response:
    """Revoke one of the tenant's own keys (DELETE /v1/keys/{id}; another tenant's key id is a 404)."""
    keys.revoke_own_key(key_id, tenant_row(db, user), db, services)
    return _keys_page(request, user, db)
