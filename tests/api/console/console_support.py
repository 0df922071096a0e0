"""Console test helpers: sign in through the form as a browser does, and read the page's CSRF token."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from fastapi.testclient import TestClient

from api.console.session import SESSION_COOKIE
from cluster.membership import InMemoryWorkerDirectory, WorkerRecord
from registry.keys import parse_key
from tests.api.test_completions_support import BASE_MODEL

CSRF_RE = re.compile(r'data-csrf="([^"]+)"')
LOGIN_CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


def sign_in(client: TestClient, key: str) -> str:
    """Sign `client` in with `key` through the login form; returns the session's CSRF token."""
    client.cookies.clear()
    token = login_form_token(client)
    response = client.post("/console/login", data={"key": key, "csrf_token": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    assert client.cookies.get(SESSION_COOKIE)
    page = client.get(response.headers["location"])
    assert page.status_code == 200, page.text
    return csrf_of(page.text)


def assert_holds_no_key(set_cookie: str, key: str) -> None:
    """The session cookie (a Set-Cookie header) holds neither `key` nor its secret (registry/keys.py's parser:
    a secret may itself contain `_`), in its raw value or in its decoded payload; nothing depends on what a
    random key happens to contain."""
    parsed = parse_key(key)
    assert parsed is not None, f"not a tenant key: {key!r}"
    value = set_cookie.split(";", 1)[0].partition("=")[2]
    payload = base64.urlsafe_b64decode(value.rpartition(".")[0] + "==").decode()
    data = json.loads(payload)
    for secret in (key, parsed.secret):
        assert secret not in set_cookie and secret not in payload
        assert secret not in {str(v) for v in data.values()}


def login_form_token(client: TestClient) -> str:
    """Open the sign-in form (which sets the pre-session cookie) and return the token it carries."""
    form = client.get("/console/login")
    assert form.status_code == 200, form.text
    match = LOGIN_CSRF_RE.search(form.text)
    assert match is not None, "the sign-in form has no CSRF token"
    return match.group(1)


def csrf_of(html: str) -> str:
    """The CSRF token a console page carries."""
    match = CSRF_RE.search(html)
    assert match is not None, "the page has no CSRF token"
    return match.group(1)


def publish_worker(client: TestClient, **stats: Any) -> None:
    """Publish one live worker `w1` with these stats (WorkerStats fields: `scheduler=SchedulerStats(...)`
    for the engine core's) as the app's worker directory."""
    directory = InMemoryWorkerDirectory()
    directory.heartbeat(WorkerRecord("w1", "http://w1", BASE_MODEL, **stats), ttl_s=3600)
    client.app.state.services.worker_directory = directory  # type: ignore[attr-defined]
