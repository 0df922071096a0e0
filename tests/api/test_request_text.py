"""Issue 33 item 2: a string a client sends that is not valid Unicode (a lone surrogate, JSON "\\ud800") is a 400
naming the field on every surface, never a 500; a usage row is written for every request whatever its text."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.errors import ApiError
from api.main import create_app
from api.request_text import TextCheckedRoute, check_pairs_text, find_invalid_text
from settings import Settings
from tests.api.conftest import ADAPTER_FILES, ADMIN, TenantHandle
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, usage_rows

LONE = "\ud800"
BOUNDARY = "lorahost-boundary"


def post_json(client: TestClient, path: str, body: Any, headers: dict[str, str], method: str = "POST") -> Any:
    """Send `body` as JSON with \\uXXXX escapes (httpx's own encoder cannot encode a lone surrogate)."""
    content = json.dumps(body).encode()  # ensure_ascii: "\ud800" goes out as the 6-character escape
    return client.request(
        method, path, content=content, headers={**headers, "Content-Type": "application/json"}
    )


def multipart_body(fields: dict[str, bytes], files: list[tuple[str, bytes]]) -> bytes:
    """A multipart body with raw bytes per field (sent with charset=utf-7, where b"+2AA-" is a lone \\ud800)."""
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value + b"\r\n"
        for name, value in fields.items()
    ]
    parts += [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + data
        + b"\r\n"
        for name, data in files
    ]
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def post_utf7_form(
    client: TestClient, path: str, fields: dict[str, bytes], headers: dict[str, str], files=()
):  # type: ignore[no-untyped-def]
    content_type = f"multipart/form-data; boundary={BOUNDARY}; charset=utf-7"
    return client.post(
        path, content=multipart_body(fields, list(files)), headers={**headers, "Content-Type": content_type}
    )


def assert_names_field(response: Any, param: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request" and error["param"] == param, error
    assert "not valid Unicode" in error["message"] and param in error["message"]


COMPLETION = {"model": BASE_MODEL, "prompt": "hello"}
CHAT = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {**COMPLETION, "prompt": f"a{LONE}b"}, "prompt"),
        ("/v1/completions", {**COMPLETION, "prompt": ["ok", LONE]}, "prompt.1"),
        ("/v1/completions", {**COMPLETION, "prompt": [1, 2, LONE]}, "prompt.2"),
        ("/v1/completions", {**COMPLETION, "model": f"tiny{LONE}"}, "model"),
        ("/v1/completions", {**COMPLETION, "stop": [LONE]}, "stop.0"),
        ("/v1/completions", {**COMPLETION, "user": LONE}, "user"),
        ("/v1/completions", {**COMPLETION, LONE: 1}, "<key>"),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": LONE}]},
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
            "messages.0.content.0.text",
        ),
        ("/v1/chat/completions", {**CHAT, "model": LONE}, "model"),
        ("/v1/adapters/some-adapter/completions", {"prompt": LONE}, "prompt"),
    ],
)
def test_inference_bodies_with_a_lone_surrogate_are_400s_naming_the_field_and_metered(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    worker = workers.add("w1")
    assert_names_field(post_json(client, path, body, tenant.headers), param)
    assert worker.requests == []
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("rejected", 0, 0)


@pytest.mark.parametrize(
    "model",
    ["a\u0000b", "x" * 500, "caf\u00e9\u200b\ufffd", "name@1\u0000"],
)
def test_a_usage_row_is_written_whatever_text_the_model_name_holds(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session, model: str
) -> None:
    """A NUL (PostgreSQL text cannot hold one) or an over-long name used to fail the row's write."""
    workers.add("w1")
    response = post_json(client, "/v1/completions", {**COMPLETION, "model": model}, tenant.headers)
    assert 400 <= response.status_code < 500, response.text
    [row] = usage_rows(db_session, tenant.id)
    assert row.status == "rejected" and len(row.model_name) <= 200 and "\u0000" not in row.model_name
    assert row.error_message is None or "\u0000" not in row.error_message


@pytest.mark.parametrize(
    ("path", "body", "param", "method"),
    [
        ("/v1/admin/tenants", {"name": f"acme{LONE}"}, "name", "POST"),
        ("/v1/admin/plans", {"name": LONE}, "name", "POST"),
        ("/v1/admin/models/tiny", {"prices": {LONE: {"per_1m_prompt": "1"}}}, "prices.<key>", "PATCH"),
    ],
)
def test_admin_bodies_with_a_lone_surrogate_are_400s_naming_the_field(
    client: TestClient, path: str, body: dict[str, Any], param: str, method: str
) -> None:
    assert_names_field(post_json(client, path, body, ADMIN, method=method), param)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": LONE, "source": "https://example.com/a.zip"}, "name"),
        ({"name": "ok", "source": f"https://example.com/{LONE}"}, "source"),
        ({"name": "ok", "source": "https://example.com/a.zip", "base_model": LONE}, "base_model"),
        ({"name": "ok", "source": "https://example.com/a.zip", "visibility": LONE}, "visibility"),
    ],
)
def test_adapter_import_bodies_with_a_lone_surrogate_are_400s_naming_the_field(
    client: TestClient, tenant: TenantHandle, body: dict[str, Any], param: str
) -> None:
    assert_names_field(post_json(client, "/v1/adapters", body, tenant.headers), param)


@pytest.mark.parametrize("field", ["name", "visibility", "base_model"])
def test_adapter_upload_form_fields_with_a_lone_surrogate_are_400s_naming_the_field(
    client: TestClient, tenant: TenantHandle, demo_adapter: Path, field: str
) -> None:
    fields = {"name": b"ok", "visibility": b"private", "base_model": BASE_MODEL.encode()} | {field: b"+2AA-"}
    files = [(name, (demo_adapter / name).read_bytes()) for name in ADAPTER_FILES]
    response = post_utf7_form(client, "/v1/adapters", fields, tenant.headers, files)
    assert_names_field(response, f"form.{field}")


def test_a_console_form_with_a_lone_surrogate_is_a_400_not_a_500(client: TestClient) -> None:
    response = post_utf7_form(client, "/console/login", {"key": b"+2AA-", "csrf_token": b"x"}, {})
    assert response.status_code == 400, response.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/adapters/%ED%A0%80"),
        ("GET", "/v1/adapters/a%00b"),
        ("DELETE", "/v1/adapters/a%00b"),
        ("GET", "/v1/usage?start=%00"),
        ("DELETE", "/v1/adapters/%ED%A0%80"),
        ("GET", "/v1/adapters?include_public=%ED%A0%80"),
        ("POST", "/v1/adapters/%ED%A0%80/completions"),
    ],
)
def test_undecodable_path_and_query_bytes_are_4xx_not_500(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, method: str, path: str
) -> None:
    """Percent-encoded surrogate bytes decode to U+FFFD (the ASGI server's unquote), never to a surrogate."""
    workers.add("w1")
    response = client.request(
        method, path, json={"prompt": "hi"} if method == "POST" else None, headers=tenant.headers
    )
    assert 400 <= response.status_code < 500, response.text


def test_path_and_query_values_are_checked_by_the_route_class() -> None:
    with pytest.raises(ApiError) as caught:
        check_pairs_text([("include_public", LONE)], "query")
    assert caught.value.status_code == 400 and caught.value.param == "query.include_public"
    assert find_invalid_text({"a": [{"b": "ok"}, {"c": LONE}]}) == "a.1.c"
    assert (
        find_invalid_text(
            {"a": ["\U0001f600", "\ud83d\ude00".encode("utf-16", "surrogatepass").decode("utf-16")]}
        )
        is None
    )


def test_every_route_of_the_app_checks_its_text(make_client: Callable[..., TestClient]) -> None:
    """A router added without route_class=TextCheckedRoute (or ConsoleRoute) fails here."""
    app = make_client().app
    routes = [r for r in app.routes if isinstance(r, APIRoute)]  # type: ignore[attr-defined]
    assert routes and all(isinstance(r, TextCheckedRoute) for r in routes), [
        r.path for r in routes if not isinstance(r, TextCheckedRoute)
    ]
    console = [r for r in routes if r.path.startswith("/console")]
    assert console, "the console is enabled in the test settings"


def test_create_app_routes_check_text_without_the_console(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, admin_key="k"))
    assert all(isinstance(r, TextCheckedRoute) for r in app.routes if isinstance(r, APIRoute))
