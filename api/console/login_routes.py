"""Sign-in and sign-out: a tenant's API key or the admin key, once, in a form; afterwards a session cookie
(HttpOnly, SameSite=Strict, Secure over TLS) that holds no key, only a signed session id whose row in the
database (registry/console_sessions.py) sign-out revokes. The sign-in form is protected against login CSRF by a
signed double-submit token: a pre-session cookie holds a random nonce and the form's token is an HMAC of it
under the console secret. Sign-in attempts are limited per client address, as uvicorn resolved it (forwarded
headers count only from settings.api.forwarded_allow_ips), over a sliding minute."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from api.console.auth import ConsoleUserDep, CsrfChecked, admin_credential, read_session
from api.console.security import ConsoleRoute
from api.console.session import (
    LOGIN_CSRF_COOKIE,
    OPERATOR,
    SESSION_COOKIE,
    TENANT,
    ConsoleSession,
    admin_fingerprint,
    encode_session,
    is_login_csrf_valid,
    login_csrf_token,
    new_login_nonce,
    new_session,
)
from api.console.templating import render
from api.deps import ServicesDep, SessionDep
from api.services import Services
from registry import api_keys, console_sessions, keys

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
COOKIE_PATH = "/console"


def home_of(session: ConsoleSession) -> str:
    """Where a user lands after signing in."""
    return "/console/admin/tenants" if session.is_operator else "/console/adapters"


@router.get("")
@router.get("/")
def console_home(request: Request, services: ServicesDep) -> RedirectResponse:
    """To the user's first page, or to the sign-in form."""
    session = read_session(request, services)
    return RedirectResponse(home_of(session) if session else "/console/login", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, services: ServicesDep) -> Response:
    """The sign-in form."""
    return _login_page(request, services)


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request, services: ServicesDep, key: str = Form(max_length=512), csrf_token: str = Form("")
) -> Response:
    """Check the key; on success set the session cookie and go to the user's first page."""
    nonce = request.cookies.get(LOGIN_CSRF_COOKIE)
    if not is_login_csrf_valid(nonce, services.console_secret, csrf_token):
        return _login_page(request, services, "the sign-in form expired: try again", status_code=403)
    refusal = await run_in_threadpool(_admit_sign_in, services, request)
    if refusal is not None:
        return refusal
    session = await run_in_threadpool(_session_for_key, services, key.strip())
    if session is None:
        return _login_page(request, services, "unknown, revoked or disabled key: check it and try again", 401)
    response = RedirectResponse(home_of(session), status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        encode_session(session, services.console_secret),
        max_age=int(services.settings.api.console_session_ttl_s),
        path=COOKIE_PATH,
        httponly=True,
        secure=request.url.scheme == "https",
        samesite="strict",
    )
    response.delete_cookie(LOGIN_CSRF_COOKIE, path=COOKIE_PATH)
    return response


@router.post("/logout")
def logout(_: CsrfChecked, user: ConsoleUserDep, db: SessionDep) -> RedirectResponse:
    """End the session: its row is revoked (a copy of the cookie no longer works) and the cookie removed."""
    console_sessions.revoke_session(db, user.session.session_id)
    db.commit()
    response = RedirectResponse("/console/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return response


def _admit_sign_in(services: Services, request: Request) -> Response | None:
    """Charge one attempt to the client address's budget (settings.api.console_max_sign_ins_per_min in any
    minute); the refusal page (429 + Retry-After) when it is spent. The address is the connection's, or the one
    a trusted proxy forwarded (uvicorn's ProxyHeadersMiddleware, settings.api.forwarded_allow_ips), never a
    header read here."""
    address = request.client.host if request.client else "unknown"
    max_per_min = services.settings.api.console_max_sign_ins_per_min
    decision = services.sign_in_limiter.acquire(f"console-sign-in:{address}", max_per_min)
    if decision.is_allowed:
        return None
    message = f"too many sign-in attempts from your address: retry in {decision.retry_after_s} s"
    response = _login_page(request, services, message, status_code=429)
    response.headers["Retry-After"] = str(decision.retry_after_s)
    return response


def _session_for_key(services: Services, key: str) -> ConsoleSession | None:
    """A new session for a valid key, recorded in the database (committed), else None."""
    ttl_s = services.settings.api.console_session_ttl_s
    credential = admin_credential(services)
    with services.session_factory() as db:
        if credential and keys.verify_admin_key(
            key, admin_key=services.settings.api.admin_key, admin_key_hash=services.admin_key_hash
        ):
            fingerprint = admin_fingerprint(services.console_secret, credential)
            session = new_session(OPERATOR, ttl_s, admin_fingerprint=fingerprint)
            tenant_id = None
        else:
            row = api_keys.find_api_key(db, key)
            if row is None or not row.tenant.is_active:
                return None
            session = new_session(TENANT, ttl_s, key_id=row.id)
            tenant_id = row.tenant_id
        expires_at = datetime.fromtimestamp(session.expires_at_s, UTC)
        console_sessions.record_session(
            db, session.session_id, session.role, expires_at, tenant_id=tenant_id, api_key_id=session.key_id
        )
        db.commit()
        return session


def _login_page(
    request: Request, services: Services, error: str | None = None, status_code: int = 200
) -> Response:
    """The sign-in form with a token bound to the pre-session cookie's nonce (a new nonce when absent)."""
    nonce = request.cookies.get(LOGIN_CSRF_COOKIE) or new_login_nonce()
    token = login_csrf_token(nonce, services.console_secret)
    response = render(request, "login.html", None, status_code, login_csrf=token, error=error)
    response.set_cookie(
        LOGIN_CSRF_COOKIE, nonce, max_age=3600, path=COOKIE_PATH, httponly=True,
        secure=request.url.scheme == "https", samesite="strict",
    )  # fmt: skip
    return response
