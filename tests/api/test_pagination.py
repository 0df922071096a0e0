"""Every list endpoint pages by cursor: `limit` and `after`, OpenAI's list envelope, 400s that say what to change,
and cursors that tell nothing about other tenants (rows written straight to the test's session)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from registry.models import ApiKey, PricePlan, Tenant, UsageRecord, new_id
from tests.api.conftest import ADMIN, TenantHandle
from tests.registry.page_rows import add_adapter, add_tenant

LISTS = [
    "/v1/adapters",
    "/v1/adapters?include_public=true",
    "/v1/adapters/my-lora/versions",
    "/v1/models",
    "/v1/keys",
    "/v1/admin/tenants",
    "/v1/admin/plans",
    "/v1/usage",
]


def _headers(path: str, tenant: TenantHandle) -> dict[str, str]:
    return ADMIN if path.startswith("/v1/admin") else tenant.headers


def _get(client: TestClient, tenant: TenantHandle, path: str, **params: Any) -> Any:
    return client.get(path, params=params, headers=_headers(path, tenant))


@pytest.fixture
def acme(tenant: TenantHandle, db_session: Session) -> TenantHandle:
    """The tenant with adapters my-lora (3 versions), alpha and zeta, 3 keys, usage on 3 (day, model) groups, and
    two more tenants."""
    row = db_session.get_one(Tenant, tenant.id)
    add_adapter(db_session, row, "my-lora", ("ready", "failed", "ready"))
    add_adapter(db_session, row, "alpha")
    add_adapter(db_session, row, "zeta", visibility="public")
    for _ in range(2):
        db_session.add(ApiKey(tenant_id=row.id, salt="s", secret_hash="h"))
    now = datetime.now(UTC)
    for days, model in ((1, "my-lora"), (1, "alpha"), (2, "alpha")):
        started = now - timedelta(days=days)
        db_session.add(
            UsageRecord(
                request_id=new_id(), tenant_id=row.id, model_name=model, status="ok", started_at=started
            )
        )
    add_tenant(db_session, "other-1")
    add_tenant(db_session, "other-2")
    db_session.add_all([PricePlan(name="basic"), PricePlan(name="pro")])
    return tenant


@pytest.mark.parametrize("path", [*LISTS, "/v1/admin/models"])
@pytest.mark.parametrize("limit", ["0", "1001", "abc", "-1", "1.5", "\u0661"])
def test_every_list_refuses_a_bad_limit_naming_the_range(
    client: TestClient, acme: TenantHandle, path: str, limit: str
) -> None:
    response = _get(client, acme, path, limit=limit)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "limit" and "from 1 to 1000" in error["message"]


@pytest.mark.parametrize("path", LISTS)
def test_every_list_answers_openai_envelope_and_walks_to_its_end(
    client: TestClient, acme: TenantHandle, path: str
) -> None:
    first = _get(client, acme, path, limit=1).json()
    assert first["object"] == "list" and len(first["data"]) == 1
    assert first["first_id"] == first["last_id"] and isinstance(first["has_more"], bool)
    seen, body = [first["last_id"]], first
    assert body["has_more"]
    while body["has_more"]:
        body = _get(client, acme, path, limit=1, after=body["last_id"]).json()
        seen.append(body["last_id"])
    assert len(seen) == len(set(seen))
    unpaged = _get(client, acme, path, limit=1000).json()
    assert seen == [item.get("id") for item in unpaged["data"]] and not unpaged["has_more"]


@pytest.mark.parametrize(
    "path",
    ["/v1/adapters", "/v1/adapters/my-lora/versions", "/v1/keys", "/v1/admin/tenants", "/v1/admin/plans"],
)
def test_an_unknown_id_as_cursor_is_a_400_saying_what_to_pass(
    client: TestClient, acme: TenantHandle, path: str
) -> None:
    response = _get(client, acme, path, after=str(uuid.uuid4()))
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_cursor"
    assert "last_id of the previous page" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "cursor"),
    [("/v1/models", "Not A Model"), ("/v1/usage", "yesterday"), ("/v1/admin/models", "never-held")],
)
def test_a_cursor_of_the_wrong_shape_is_a_400(
    client: TestClient, acme: TenantHandle, path: str, cursor: str
) -> None:
    response = _get(client, acme, path, after=cursor)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_cursor"


def _same_answer(get: Callable[[str], Any], foreign_id: str) -> None:
    unknown_id = str(uuid.uuid4())
    foreign, unknown = get(foreign_id), get(unknown_id)
    assert foreign.status_code == unknown.status_code == 400
    assert foreign.text.replace(foreign_id, "<id>") == unknown.text.replace(unknown_id, "<id>")


def test_another_tenants_ids_are_cursors_of_nothing_like_unknown_ids(
    client: TestClient, acme: TenantHandle, new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    bob = new_tenant("bob")
    bob_row = db_session.get_one(Tenant, bob.id)
    private = add_adapter(db_session, bob_row, "secret")
    public = add_adapter(db_session, bob_row, "shared", visibility="public")
    for path in ("/v1/adapters", "/v1/adapters?include_public=true"):
        _same_answer(lambda after, p=path: _get(client, acme, p, after=after), private.id)
    _same_answer(lambda after: _get(client, acme, "/v1/adapters", after=after), public.id)
    _same_answer(
        lambda after: _get(client, acme, "/v1/adapters/my-lora/versions", after=after), private.versions[0].id
    )
    _same_answer(lambda after: _get(client, acme, "/v1/keys", after=after), bob.key_id)


def test_versions_of_a_missing_or_pinned_adapter(client: TestClient, acme: TenantHandle) -> None:
    missing = _get(client, acme, "/v1/adapters/nope/versions")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "adapter_not_found"
    pinned = _get(client, acme, "/v1/adapters/my-lora@1/versions")
    assert pinned.status_code == 400 and "without @N" in pinned.json()["error"]["message"]
    versions = _get(client, acme, "/v1/adapters/my-lora/versions", limit=2).json()
    assert [v["model"] for v in versions["data"]] == ["my-lora@1", "my-lora@2"] and versions["has_more"]
