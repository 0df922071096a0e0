"""Console sessions end on the server (issue 33 item 7): sign-out revokes the session's row so a copied cookie
no longer works, on any replica; the sign-in form's token is bound to its pre-session cookie's signed nonce;
sign-in attempts are limited over a sliding minute."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.console.session import LOGIN_CSRF_COOKIE, SESSION_COOKIE, decode_session
from api.ratelimit import InMemoryRateLimiter
from api.sliding_ratelimit import InMemorySlidingLimiter
from registry.console_sessions import hash_session_id
from registry.models import ConsoleSessionRecord, utcnow
from tests.api.conftest import ADMIN_KEY, TenantHandle
from tests.api.console.console_support import login_form_token, sign_in
from tests.api.test_ratelimit import FakeClock


def _signed_out_copy(client: TestClient, key: str) -> str:
    """Sign in with `key`, keep a copy of the session cookie, sign out; returns the copy."""
    csrf = sign_in(client, key)
    copied = client.cookies.get(SESSION_COOKIE)
    assert copied is not None
    assert (
        client.post("/console/logout", data={"csrf_token": csrf}, follow_redirects=False).status_code == 303
    )
    return copied


def test_a_copied_cookie_no_longer_works_after_sign_out(client: TestClient, tenant: TenantHandle) -> None:
    copied = _signed_out_copy(client, tenant.key)
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, copied)
    assert client.get("/console/adapters", follow_redirects=False).status_code == 303
    fetch = client.get("/console/adapters/x", headers={"HX-Request": "true"})
    assert fetch.status_code == 401


def test_an_operator_cookie_copied_before_sign_out_no_longer_works(client: TestClient) -> None:
    copied = _signed_out_copy(client, ADMIN_KEY)
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, copied)
    assert client.get("/console/admin/billing", follow_redirects=False).status_code == 303


def test_sign_out_on_one_replica_ends_the_session_on_another(
    make_client: Callable[..., TestClient], tenant: TenantHandle
) -> None:
    one, two = make_client(console_secret="shared"), make_client(console_secret="shared")
    sign_in(one, tenant.key)
    two.cookies.set(SESSION_COOKIE, one.cookies.get(SESSION_COOKIE) or "")
    assert two.get("/console/adapters").status_code == 200  # the other replica accepts the session...
    csrf = sign_in(one, tenant.key)
    two.cookies.set(SESSION_COOKIE, one.cookies.get(SESSION_COOKIE) or "")
    one.post("/console/logout", data={"csrf_token": csrf})
    assert two.get("/console/adapters", follow_redirects=False).status_code == 303  # ...until it is ended


def test_only_a_hash_of_the_session_id_is_stored_with_who_signed_in(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    sign_in(client, tenant.key)
    session = decode_session(client.cookies.get(SESSION_COOKIE), client.app.state.services.console_secret)  # type: ignore[attr-defined]
    assert session is not None
    row = db_session.get(ConsoleSessionRecord, hash_session_id(session.session_id))
    assert row is not None and row.session_id_hash != session.session_id
    assert (row.role, row.tenant_id, row.api_key_id, row.revoked_at) == (
        "tenant",
        tenant.id,
        tenant.key_id,
        None,
    )
    assert timedelta(hours=11) < row.expires_at - row.created_at <= timedelta(hours=12)
    stored = db_session.scalars(select(ConsoleSessionRecord)).all()
    assert all(session.session_id not in (r.session_id_hash, r.tenant_id, r.api_key_id) for r in stored)


def test_a_session_whose_row_expired_is_refused_and_cleaned_on_a_later_sign_in(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    sign_in(client, tenant.key)
    cookie = client.cookies.get(SESSION_COOKIE)
    session = decode_session(cookie, client.app.state.services.console_secret)  # type: ignore[attr-defined]
    assert session is not None
    row = db_session.get(ConsoleSessionRecord, hash_session_id(session.session_id))
    assert row is not None
    row.expires_at = utcnow() - timedelta(seconds=1)  # the cookie's own expiry is still ahead
    db_session.commit()
    assert client.get("/console/adapters", follow_redirects=False).status_code == 303
    sign_in(client, tenant.key)
    db_session.expire_all()
    assert db_session.get(ConsoleSessionRecord, hash_session_id(session.session_id)) is None


def test_the_sign_in_token_must_be_the_one_issued_for_the_cookie_nonce(
    make_client: Callable[..., TestClient], tenant: TenantHandle
) -> None:
    client = make_client()
    # the old double-submit check accepted any value sent both as the cookie and as the field
    client.cookies.set(LOGIN_CSRF_COOKIE, "chosen-by-the-attacker", path="/console")
    forged = client.post("/console/login", data={"key": tenant.key, "csrf_token": "chosen-by-the-attacker"})
    assert forged.status_code == 403 and client.cookies.get(SESSION_COOKIE) is None
    # a genuine token is good only with the nonce it was issued for
    other = make_client()
    token = login_form_token(other)
    client.cookies.clear()
    login_form_token(client)
    mismatched = client.post("/console/login", data={"key": tenant.key, "csrf_token": token})
    assert mismatched.status_code == 403 and client.cookies.get(SESSION_COOKIE) is None
    other_response = other.post(
        "/console/login", data={"key": tenant.key, "csrf_token": token}, follow_redirects=False
    )
    assert other_response.status_code == 303


def test_the_sign_in_form_keeps_the_nonce_secret_from_the_page(client: TestClient) -> None:
    token = login_form_token(client)
    nonce = client.cookies.get(LOGIN_CSRF_COOKIE)
    assert nonce and token != nonce
    assert nonce not in client.get("/console/login").text


def test_sign_ins_are_limited_over_a_sliding_minute_not_per_calendar_minute(
    make_client: Callable[..., TestClient], tenant: TenantHandle
) -> None:
    client = make_client(console_max_sign_ins_per_min=3)
    clock = FakeClock(1_000_019.0)  # one second before a minute boundary
    services = client.app.state.services  # type: ignore[attr-defined]
    services.rate_limiter = InMemoryRateLimiter(clock)  # what the old fixed-window check used
    services.sign_in_limiter = InMemorySlidingLimiter(clock)
    form = {"key": "lh_wrong", "csrf_token": login_form_token(client)}
    assert [client.post("/console/login", data=form).status_code for _ in range(3)] == [401, 401, 401]
    clock.now = 1_000_021.0  # the next calendar minute, 2 s later
    refused = client.post("/console/login", data={**form, "key": tenant.key})
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "58"
    clock.now = 1_000_079.0  # 60 s after the first attempt
    assert (
        client.post("/console/login", data={**form, "key": tenant.key}, follow_redirects=False).status_code
        == 303
    )
