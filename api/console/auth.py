"""Who is signed in to the console: the session cookie (api/console/session.py) checked against the database
on every request: its server-side row (registry/console_sessions.py) must be neither revoked (sign-out) nor
expired, and, as the REST API checks a bearer key, a revoked key or a disabled tenant ends the session and a
changed admin key ends operator sessions. Pages take `ConsoleTenant` or `ConsoleOperator`; every
state-changing route also takes `CsrfChecked`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from api.caches import TenantAuth
from api.console.session import (
    SESSION_COOKIE,
    ConsoleSession,
    admin_fingerprint,
    csrf_token,
    decode_session,
    is_csrf_valid,
)
from api.deps import ServicesDep, SessionDep, tenant_auth_of
from api.services import Services
from registry.console_sessions import find_live_session
from registry.models import ApiKey, Tenant

CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"


class SignInRequired(Exception):
    """No valid console session: pages redirect to the sign-in form, fetches get 401."""


class ConsoleForbidden(Exception):
    """A signed-in user asked for what its role may not see or do (403)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class ConsoleUser:
    """A verified console session and what pages need to know about its user."""

    session: ConsoleSession
    csrf_token: str
    tenant_id: str | None = None  # None for the operator
    tenant_name: str | None = None
    key_id: str | None = None
    can_manage_keys: bool = False

    @property
    def is_operator(self) -> bool:
        """True for the operator."""
        return self.session.is_operator


def admin_credential(services: Services) -> str | None:
    """The configured admin key, else its stored hash (what an operator session's fingerprint is taken of)."""
    return services.settings.api.admin_key or services.admin_key_hash


def read_session(request: Request, services: Services) -> ConsoleSession | None:
    """The request's signed, unexpired session cookie, if any (not yet checked against the database)."""
    return decode_session(request.cookies.get(SESSION_COOKIE), services.console_secret)


def get_console_user(request: Request, services: ServicesDep, session: SessionDep) -> ConsoleUser:
    """The signed-in user, re-verified: SignInRequired when the session or what it stands on is gone."""
    console_session = read_session(request, services)
    if console_session is None or not _is_recorded(session, console_session):
        raise SignInRequired()
    token = csrf_token(console_session, services.console_secret)
    if console_session.is_operator:
        credential = admin_credential(services)
        expected = admin_fingerprint(services.console_secret, credential) if credential else None
        if expected is None or console_session.admin_fingerprint != expected:
            raise SignInRequired()
        return ConsoleUser(console_session, token)
    key = _live_key(session, console_session.key_id)
    if key is None:
        raise SignInRequired()
    tenant = key.tenant
    return ConsoleUser(console_session, token, tenant.id, tenant.name, key.id, tenant.can_manage_keys)


def _is_recorded(session: Session, console_session: ConsoleSession) -> bool:
    """The session's row is live (not signed out, not expired) and names what the cookie names."""
    row = find_live_session(session, console_session.session_id)
    return row is not None and row.role == console_session.role and row.api_key_id == console_session.key_id


def _live_key(session: Session, key_id: str | None) -> ApiKey | None:
    key = session.get(ApiKey, key_id) if key_id else None
    if key is None or key.revoked_at is not None or not key.tenant.is_active:
        return None
    return key


def tenant_row(db: Session, user: ConsoleUser) -> Tenant:
    """The signed-in tenant's row, for the actions the console calls; SignInRequired when it is gone."""
    tenant = db.get(Tenant, user.tenant_id) if user.tenant_id else None
    if tenant is None:  # deleted since the session check
        raise SignInRequired()
    return tenant


def get_console_tenant(user: Annotated[ConsoleUser, Depends(get_console_user)]) -> ConsoleUser:
    """A tenant's session; the operator is sent to its own pages (ConsoleForbidden)."""
    if user.is_operator:
        raise ConsoleForbidden("these are a tenant's pages: the operator's are under /console/admin")
    return user


def get_console_operator(user: Annotated[ConsoleUser, Depends(get_console_user)]) -> ConsoleUser:
    """The operator's session; a tenant gets ConsoleForbidden."""
    if not user.is_operator:
        raise ConsoleForbidden("this page is for the operator: sign in with the admin key")
    return user


async def check_csrf(request: Request, user: Annotated[ConsoleUser, Depends(get_console_user)]) -> None:
    """The request carries the session's CSRF token (header, else the urlencoded form field), or 403."""
    presented = request.headers.get(CSRF_HEADER)
    content_type = request.headers.get("content-type", "")
    if presented is None and content_type.startswith("application/x-www-form-urlencoded"):
        value = (await request.form()).get(CSRF_FIELD)
        presented = value if isinstance(value, str) else None
    if not is_csrf_valid(user.session, request.app.state.services.console_secret, presented):
        raise ConsoleForbidden("missing or wrong CSRF token: reload the page and try again")


def tenant_auth_for(services: Services, user: ConsoleUser) -> TenantAuth:
    """The inference path's TenantAuth for a tenant's console session (the key it signed in with)."""
    with services.session_factory() as session:
        key = _live_key(session, user.key_id)
        if key is None:
            raise SignInRequired()
        return tenant_auth_of(key)


ConsoleUserDep = Annotated[ConsoleUser, Depends(get_console_user)]
ConsoleTenant = Annotated[ConsoleUser, Depends(get_console_tenant)]
ConsoleOperator = Annotated[ConsoleUser, Depends(get_console_operator)]
CsrfChecked = Annotated[None, Depends(check_csrf)]
