"""Console sign-in, sessions and CSRF: the cookie holds no key and is HttpOnly/SameSite, a revoked key or a
changed admin key ends sessions, every state-changing route needs the session's CSRF token, and each role
sees only its own pages."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from api.console.security import CONTENT_SECURITY_POLICY
from api.console.session import SESSION_COOKIE
from tests.api.conftest import ADMIN, ADMIN_KEY, TenantHandle
from tests.api.console.console_support import assert_holds_no_key, login_form_token, sign_in


def test_sign_in_sets_an_http_only_strict_cookie_that_holds_no_key(
    client: TestClient, tenant: TenantHandle
) -> None:
    token = login_form_token(client)
    response = client.post(
        "/console/login", data={"key": tenant.key, "csrf_token": token}, follow_redirects=False
    )
    assert response.status_code == 303 and response.headers["location"] == "/console/adapters"
    set_cookie = next(v for v in response.headers.get_list("set-cookie") if v.startswith(SESSION_COOKIE))
    assert "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie and "Path=/console" in set_cookie
    assert "Secure" not in set_cookie  # plain http in the test; https sets it
    assert_holds_no_key(set_cookie, tenant.key)
    page = client.get("/console/adapters")
    assert page.status_code == 200 and "acme" in page.text
    assert tenant.key not in page.text


def test_sign_in_over_https_marks_the_cookie_secure(
    make_client: Callable[..., TestClient], tenant: TenantHandle
) -> None:
    https = make_client()
    https.base_url = https.base_url.copy_with(scheme="https")
    token = login_form_token(https)
    response = https.post(
        "/console/login",
        data={"key": tenant.key, "csrf_token": token},
        follow_redirects=False,
    )
    set_cookie = next(v for v in response.headers.get_list("set-cookie") if v.startswith(SESSION_COOKIE))
    assert "Secure" in set_cookie


def test_a_wrong_key_is_refused_with_a_message_and_no_session(
    client: TestClient, tenant: TenantHandle
) -> None:
    token = login_form_token(client)
    response = client.post("/console/login", data={"key": tenant.key + "x", "csrf_token": token})
    assert response.status_code == 401 and "unknown, revoked or disabled key" in response.text
    assert client.cookies.get(SESSION_COOKIE) is None


def test_sign_in_without_the_login_form_token_is_refused(client: TestClient, tenant: TenantHandle) -> None:
    response = client.post("/console/login", data={"key": tenant.key, "csrf_token": "forged"})
    assert response.status_code == 403 and client.cookies.get(SESSION_COOKIE) is None


def test_pages_redirect_to_sign_in_and_fetches_get_401_without_a_session(client: TestClient) -> None:
    page = client.get("/console/adapters", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/console/login"
    fragment = client.get("/console/adapters/x", headers={"HX-Request": "true"})
    assert fragment.status_code == 401 and fragment.headers["HX-Redirect"] == "/console/login"
    assert client.post("/console/playground/chat", json={}).status_code == 401


def test_a_forged_session_cookie_is_not_a_session(client: TestClient, tenant: TenantHandle) -> None:
    sign_in(client, tenant.key)
    value = client.cookies.get(SESSION_COOKIE)
    payload, _, signature = value.rpartition(".")
    forged = "AA" if signature[-2:] != "AA" else "BB"
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, payload + "." + signature[:-2] + forged)
    assert client.get("/console/adapters", follow_redirects=False).status_code == 303


def test_revoking_the_key_ends_its_console_session(client: TestClient, tenant: TenantHandle) -> None:
    sign_in(client, tenant.key)
    assert client.get("/console/adapters").status_code == 200
    assert client.delete(f"/v1/admin/keys/{tenant.key_id}", headers=ADMIN).status_code == 200
    assert client.get("/console/adapters", follow_redirects=False).status_code == 303


def test_disabling_the_tenant_ends_its_console_session(client: TestClient, tenant: TenantHandle) -> None:
    sign_in(client, tenant.key)
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"is_active": False}, headers=ADMIN)
    assert client.get("/console/usage", follow_redirects=False).status_code == 303


def test_a_changed_admin_key_ends_operator_sessions(make_client: Callable[..., TestClient]) -> None:
    old = make_client(console_secret="shared-secret")
    sign_in(old, ADMIN_KEY)
    cookie = old.cookies.get(SESSION_COOKIE)
    rotated = make_client(console_secret="shared-secret", admin_key="a-new-admin-key")
    rotated.cookies.set(SESSION_COOKIE, cookie)
    assert rotated.get("/console/admin/billing", follow_redirects=False).status_code == 303
    same = make_client(console_secret="shared-secret")
    same.cookies.set(SESSION_COOKIE, cookie)
    assert same.get("/console/admin/billing").status_code == 200


def test_a_tenant_cannot_open_operator_pages_nor_the_operator_tenant_pages(
    client: TestClient, tenant: TenantHandle
) -> None:
    sign_in(client, tenant.key)
    for path in ("/console/admin/tenants", "/console/admin/billing", "/console/admin/billing.csv",
                 "/console/admin/slo", "/console/admin/workers", "/console/admin/placement",
                 "/console/admin/predictor", "/console/admin/planner"):  # fmt: skip
        response = client.get(path)
        assert response.status_code == 403, path
        assert "for the operator" in response.text
    sign_in(client, ADMIN_KEY)
    assert client.get("/console/adapters").status_code == 403


def test_state_changing_routes_need_the_session_csrf_token(
    client: TestClient, tenant: TenantHandle, new_tenant: Callable[[str], TenantHandle]
) -> None:
    csrf = sign_in(client, tenant.key)
    other_csrf = sign_in(make_other := client, new_tenant("other").key)  # another session's token
    sign_in(client, tenant.key)
    assert other_csrf != csrf and make_other is client
    posts = [
        ("/console/keys", {}),
        ("/console/adapters", {}),
        ("/console/playground/chat", {}),
        ("/console/logout", {}),
    ]
    for path, data in posts:
        assert client.post(path, data=data).status_code == 403, path
        assert client.post(path, data=data, headers={"X-CSRF-Token": other_csrf}).status_code == 403, path
        assert client.post(path, data={"csrf_token": "nope"}).status_code == 403, path
    admin_csrf = sign_in(client, ADMIN_KEY)
    for path in ("/console/admin/tenants", "/console/admin/plans", f"/console/admin/tenants/{tenant.id}",
                 f"/console/admin/tenants/{tenant.id}/keys", "/console/admin/planner"):  # fmt: skip
        assert client.post(path, data={"name": "x"}).status_code == 403, path
    assert (
        client.post("/console/admin/tenants", data={"name": "made", "csrf_token": admin_csrf}).status_code
        == 200
    )


def test_pages_carry_a_strict_content_security_policy(client: TestClient, tenant: TenantHandle) -> None:
    login = client.get("/console/login")
    assert login.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY and "'unsafe-eval'" not in CONTENT_SECURITY_POLICY
    sign_in(client, tenant.key)
    page = client.get("/console/adapters")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
    assert "<script>" not in page.text and " on" + "click=" not in page.text  # no inline script or handler


def test_sign_out_removes_the_session(client: TestClient, tenant: TenantHandle) -> None:
    csrf = sign_in(client, tenant.key)
    response = client.post("/console/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/console/login"
    assert client.get("/console/adapters", follow_redirects=False).status_code == 303


def test_the_vendored_scripts_are_served(client: TestClient) -> None:
    for path in ("/console/static/vendor/htmx.min.js", "/console/static/vendor/chart.umd.min.js",
                 "/console/static/console.js", "/console/static/console.css"):  # fmt: skip
        assert client.get(path).status_code == 200, path


def test_a_form_posted_after_the_session_ended_goes_to_sign_in(
    client: TestClient, tenant: TenantHandle
) -> None:
    csrf = sign_in(client, tenant.key)
    client.delete(f"/v1/admin/keys/{tenant.key_id}", headers=ADMIN)
    html = {"Accept": "text/html,application/xhtml+xml"}
    response = client.post("/console/keys", data={"csrf_token": csrf}, headers=html, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/console/login"


def test_sign_in_attempts_are_limited_per_client_address(
    make_client: Callable[..., TestClient], tenant: TenantHandle
) -> None:
    client = make_client(console_max_sign_ins_per_min=3)
    form = {"key": "lh_wrong", "csrf_token": login_form_token(client)}
    assert [client.post("/console/login", data=form).status_code for _ in range(3)] == [401, 401, 401]
    refused = client.post("/console/login", data={**form, "key": tenant.key})  # even the right key, now
    assert refused.status_code == 429 and "too many sign-in attempts" in refused.text
    assert int(refused.headers["Retry-After"]) > 0
    assert client.cookies.get(SESSION_COOKIE) is None
