"""Authentication and tenant isolation (api/deps.py): tenant keys, the admin key, disabled tenants."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from registry import keys
from tests.api.conftest import ADMIN, adapter_paths, upload

TENANT_ROUTES = [
    ("get", "/v1/adapters"),
    ("get", "/v1/models"),
    ("get", "/v1/adapters/x"),
    ("post", "/v1/adapters"),
]


@pytest.mark.parametrize(("method", "path"), TENANT_ROUTES)
def test_missing_key_is_401(client, method: str, path: str) -> None:
    response = getattr(client, method)(path)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert "Bearer" in response.json()["error"]["message"]


@pytest.mark.parametrize("bad_key", ["nonsense", "lh_x_y", "Basic abc"])
def test_invalid_key_is_401(client, tenant, bad_key: str) -> None:
    response = client.get("/v1/models", headers={"Authorization": f"Bearer {bad_key}"})
    assert response.status_code == 401


def test_key_with_wrong_secret_is_401(client, tenant) -> None:
    wrong = tenant.key[:-4] + ("aaaa" if not tenant.key.endswith("aaaa") else "bbbb")
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {wrong}"}).status_code == 401


def test_revoked_key_is_401(client, tenant) -> None:
    assert client.get("/v1/models", headers=tenant.headers).status_code == 200
    assert client.delete(f"/v1/admin/keys/{tenant.key_id}", headers=ADMIN).status_code == 200
    response = client.get("/v1/models", headers=tenant.headers)
    assert response.status_code == 401 and "revoked" in response.json()["error"]["message"]


def test_disabled_tenant_is_403_with_a_message_and_enabled_again_works(client, tenant) -> None:
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"is_active": False}, headers=ADMIN)
    response = client.get("/v1/models", headers=tenant.headers)
    assert response.status_code == 403
    assert response.json()["error"] == {
        "type": "tenant_disabled",
        "message": "this tenant is disabled; contact the operator to re-enable it",
    }
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"is_active": True}, headers=ADMIN)
    assert client.get("/v1/models", headers=tenant.headers).status_code == 200


def test_admin_routes_refuse_tenant_keys_and_missing_keys(client, tenant) -> None:
    assert client.get("/v1/admin/tenants", headers=tenant.headers).status_code == 401
    assert client.get("/v1/admin/tenants").status_code == 401
    assert client.get("/v1/admin/tenants", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_tenant_cannot_list_read_use_or_delete_another_tenants_private_adapter(
    client, new_tenant, demo_adapter
) -> None:
    alice, bob = new_tenant("alice"), new_tenant("bob")
    assert upload(client, alice, "secret", adapter_paths(demo_adapter)).status_code == 202
    assert client.get("/v1/adapters", headers=bob.headers).json()["data"] == []
    assert client.get("/v1/adapters?include_public=true", headers=bob.headers).json()["data"] == []
    assert "secret" not in [m["id"] for m in client.get("/v1/models", headers=bob.headers).json()["data"]]
    for response in (
        client.get("/v1/adapters/secret", headers=bob.headers),
        client.get("/v1/adapters/secret@1", headers=bob.headers),
        client.get("/v1/models/secret", headers=bob.headers),
        client.delete("/v1/adapters/secret", headers=bob.headers),
    ):
        assert response.status_code == 404, response.text
    assert client.get("/v1/adapters/secret", headers=alice.headers).status_code == 200


def test_public_adapter_is_visible_to_others_but_only_its_owner_deletes_it(
    client, new_tenant, demo_adapter
) -> None:
    alice, bob = new_tenant("alice"), new_tenant("bob")
    upload(client, alice, "shared", adapter_paths(demo_adapter), visibility="public")
    assert client.get("/v1/adapters/shared", headers=bob.headers).json()["owner"] == "alice"
    assert client.get("/v1/models/shared", headers=bob.headers).json()["owned_by"] == "alice"
    assert client.delete("/v1/adapters/shared", headers=bob.headers).status_code == 403
    assert client.delete("/v1/adapters/shared", headers=alice.headers).status_code == 200


def test_keys_are_never_stored_in_clear(client, tenant, db_session) -> None:
    secret = keys.parse_key(tenant.key).secret
    rows = db_session.execute(text("SELECT id, tenant_id, salt, secret_hash FROM api_keys")).all()
    dump = repr(rows)
    assert rows and secret not in dump and tenant.key not in dump


def test_generated_admin_key_works_through_its_stored_hash(make_client, tmp_path) -> None:
    data_dir = tmp_path / "state"
    admin_key = keys.ensure_admin_key_hash(data_dir)
    assert admin_key and keys.ensure_admin_key_hash(data_dir) is None
    assert admin_key not in (data_dir / keys.ADMIN_KEY_HASH_FILENAME).read_text()
    client = make_client(admin_key=None, data_dir=data_dir)
    assert (
        client.get("/v1/admin/tenants", headers={"Authorization": f"Bearer {admin_key}"}).status_code == 200
    )
    assert (
        client.get("/v1/admin/tenants", headers={"Authorization": "Bearer lhadmin_wrong"}).status_code == 401
    )


def test_without_any_admin_key_admin_routes_are_closed(make_client, tmp_path) -> None:
    client = make_client(admin_key=None, data_dir=tmp_path / "empty")
    assert client.get("/v1/admin/tenants", headers={"Authorization": "Bearer "}).status_code == 401
