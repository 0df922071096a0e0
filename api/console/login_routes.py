"""Sign-in and sign-out: a tenant's API key or the admin key, once, in a form; afterwards a session cookie
(HttpOnly, SameSite=Strict, Secure over TLS) that holds no key. The sign-in form is protected against login
CSRF by a double-submit token (a cookie and a hidden field that must match)."""

from __future__ import annotations

import hmac
import secrets

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
    new_session,
)
from api.console.templating import render
from api.deps import ServicesDep
from api.ratelimit import RateLimits
from api.services import Services
from registry import api_keys, keys

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
def login_form(request: Request) -> Response:
    """The sign-in form."""
    return _login_page(request)


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request, services: ServicesDep, key: str = Form(max_length=512), csrf_token: str = Form("")
) -> Response:
    """Check the key; on success set the session cookie and go to the user's first page."""
    expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not expected or not hmac.compare_digest(csrf_token, expected):
        return _login_page(request, "the sign-in form expired: try again", status_code=403)
    refusal = await run_in_threadpool(_admit_sign_in, services, request)
    if refusal is not None:
        return refusal
    session = await run_in_threadpool(_session_for_key, services, key.strip())
    if session is None:
        return _login_page(request, "unknown, revoked or disabled key: check it and try again", 401)
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
def logout(_: CsrfChecked, user: ConsoleUserDep) -> RedirectResponse:
    """End the session (the cookie is removed)."""
    response = RedirectResponse("/console/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return response


def _admit_sign_in(services: Services, request: Request) -> Response | None:
    """Charge one attempt to the client address's budget (settings.api.console_max_sign_ins_per_min); the
    refusal page (429 + Retry-After) when it is spent."""
    address = request.client.host if request.client else "unknown"
    limits = RateLimits(max_requests_per_min=services.settings.api.console_max_sign_ins_per_min)
    decision = services.rate_limiter.acquire(f"console-sign-in:{address}", 0, limits)
    if decision.is_allowed:
        return None
    message = f"too many sign-in attempts from your address: retry in {decision.retry_after_s} s"
    response = _login_page(request, message, status_code=429)
    response.headers["Retry-After"] = str(decision.retry_after_s)
    return response


def _session_for_key(services: Services, key: str) -> ConsoleSession | None:
    ttl_s = services.settings.api.console_session_ttl_s
    credential = admin_credential(services)
    if credential and keys.verify_admin_key(
        key, admin_key=services.settings.api.admin_key, admin_key_hash=services.admin_key_hash
    ):
        return new_session(
            OPERATOR, ttl_s, admin_fingerprint=admin_fingerprint(services.console_secret, credential)
        )
    with services.session_factory() as db:
        row = api_keys.find_api_key(db, key)
        if row is None or not row.tenant.is_active:
            return None
        return new_session(TENANT, ttl_s, key_id=row.id)


def _login_page(request: Request, error: str | None = None, status_code: int = 200) -> Response:
    token = request.cookies.get(LOGIN_CSRF_COOKIE) or secrets.token_urlsafe(24)
    response = render(request, "login.html", None, status_code, login_csrf=token, error=error)
    response.set_cookie(
        LOGIN_CSRF_COOKIE, token, max_age=3600, path=COOKIE_PATH, httponly=True,
        secure=request.url.scheme == "https", samesite="strict",
    )  # fmt: skip
    return response
