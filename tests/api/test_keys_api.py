"""/v1/keys: a tenant lists its keys always, creates and revokes them only when the operator allows it, and
never touches another tenant's key."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from tests.api.conftest import ADMIN, TenantHandle


def test_keys_are_listed_without_the_secret(client: TestClient, tenant: TenantHandle) -> None:
    response = client.get("/v1/keys", headers=tenant.headers)
    assert response.status_code == 200
    [key] = response.json()["data"]
    assert key["id"] == tenant.key_id and key["revoked_at"] is None and "key" not in key
    assert client.get("/v1/keys").status_code == 401


def test_creating_or_revoking_needs_the_operators_permission(
    client: TestClient, tenant: TenantHandle
) -> None:
    refused = client.post("/v1/keys", headers=tenant.headers)
    assert (
        refused.status_code == 403
        and "your operator manages your API keys" in refused.json()["error"]["message"]
    )
    assert client.delete(f"/v1/keys/{tenant.key_id}", headers=tenant.headers).status_code == 403
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"can_manage_keys": True}, headers=ADMIN)
    created = client.post("/v1/keys", headers=tenant.headers)
    assert created.status_code == 201
    new = {"Authorization": f"Bearer {created.json()['key']}"}
    assert client.get("/v1/adapters", headers=new).status_code == 200
    revoked = client.delete(f"/v1/keys/{tenant.key_id}", headers=new)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert client.get("/v1/adapters", headers=tenant.headers).status_code == 401  # at once on this replica
    assert [k["revoked_at"] is None for k in client.get("/v1/keys", headers=new).json()["data"]] == [
        True,
        False,
    ]


def test_another_tenants_key_is_not_found(
    client: TestClient, tenant: TenantHandle, new_tenant: Callable[[str], TenantHandle]
) -> None:
    other = new_tenant("other")
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"can_manage_keys": True}, headers=ADMIN)
    response = client.delete(f"/v1/keys/{other.key_id}", headers=tenant.headers)
    assert response.status_code == 404
    assert client.get("/v1/adapters", headers=other.headers).status_code == 200
    assert other.key_id not in client.get("/v1/keys", headers=tenant.headers).text
