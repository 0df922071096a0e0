"""Every response under /console carries the console's security headers (issue 33 item 7): pages, static files,
redirects, 401/403/404/405 and 500s; the rest of the API is left as it was."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.testclient import TestClient

from api.console.security import CONTENT_SECURITY_POLICY, STATIC_CACHE_CONTROL
from tests.api.conftest import TenantHandle
from tests.api.console.console_support import sign_in


def _assert_secured(response: object, cache_control: str = "no-store") -> None:
    headers = response.headers  # type: ignore[attr-defined]
    assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY, response
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "same-origin"
    assert headers["cache-control"] == cache_control


def test_static_files_carry_the_security_headers(client: TestClient) -> None:
    for path in ("/console/static/console.js", "/console/static/console.css",
                 "/console/static/vendor/htmx.min.js", "/console/static/vendor/chart.umd.min.js"):  # fmt: skip
        response = client.get(path)
        assert response.status_code == 200, path
        _assert_secured(response, STATIC_CACHE_CONTROL)
    missing = client.get("/console/static/nope.js")
    assert missing.status_code == 404
    _assert_secured(missing, STATIC_CACHE_CONTROL)


def test_redirects_and_errors_under_console_carry_them(client: TestClient, tenant: TenantHandle) -> None:
    _assert_secured(client.get("/console", follow_redirects=False))
    _assert_secured(client.get("/console/adapters", follow_redirects=False))  # 303 to sign-in
    _assert_secured(client.get("/console/adapters/x", headers={"HX-Request": "true"}))  # 401
    _assert_secured(client.get("/console/no-such-page"))  # 404
    _assert_secured(client.put("/console/login"))  # 405
    sign_in(client, tenant.key)
    _assert_secured(client.get("/console/admin/billing"))  # 403


def test_a_server_error_under_console_carries_them(make_client: Callable[..., TestClient]) -> None:
    app = make_client().app
    boom = APIRouter()

    @boom.get("/console/boom")
    def explode() -> None:
        raise RuntimeError("boom")

    app.include_router(boom)  # type: ignore[attr-defined]
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/console/boom")
        assert response.status_code == 500
        _assert_secured(response)


def test_the_rest_of_the_api_is_left_alone(client: TestClient) -> None:
    health = client.get("/v1/health")
    assert "content-security-policy" not in health.headers and "x-frame-options" not in health.headers
