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


# ---- issue 33 item 8: a cap on live keys, no self lock-out, and calls count against requests_per_min ------


def _allow_key_management(client: TestClient, tenant: TenantHandle) -> None:
    patched = client.patch(f"/v1/admin/tenants/{tenant.id}", json={"can_manage_keys": True}, headers=ADMIN)
    assert patched.status_code == 200, patched.text


def test_live_keys_are_capped_per_tenant_for_the_tenant_and_the_operator(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle]
) -> None:
    tenant = new_tenant("many-keys")  # holds one key
    client = make_client(max_keys_per_tenant=3)
    _allow_key_management(client, tenant)
    created = [client.post("/v1/keys", headers=tenant.headers) for _ in range(2)]
    assert [r.status_code for r in created] == [201, 201]
    refused = client.post("/v1/keys", headers=tenant.headers)
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "key_limit_reached"
    message = refused.json()["error"]["message"]
    assert "3" in message and "LORAHOST_MAX_KEYS_PER_TENANT" in message and "revoke" in message
    by_operator = client.post(f"/v1/admin/tenants/{tenant.id}/keys", headers=ADMIN)
    assert by_operator.status_code == 409 and by_operator.json()["error"]["type"] == "key_limit_reached"
    assert client.delete(f"/v1/keys/{created[0].json()['id']}", headers=tenant.headers).status_code == 200
    assert client.post("/v1/keys", headers=tenant.headers).status_code == 201  # a revoked key frees its place
    assert (
        sum(k["revoked_at"] is None for k in client.get("/v1/keys", headers=tenant.headers).json()["data"])
        == 3
    )


def test_a_tenant_cannot_revoke_its_last_live_key(client: TestClient, tenant: TenantHandle) -> None:
    _allow_key_management(client, tenant)
    refused = client.delete(f"/v1/keys/{tenant.key_id}", headers=tenant.headers)
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "last_live_key"
    assert "create another key first" in refused.json()["error"]["message"].lower()
    assert client.get("/v1/keys", headers=tenant.headers).status_code == 200  # still signed in
    other = client.post("/v1/keys", headers=tenant.headers).json()
    assert client.delete(f"/v1/keys/{tenant.key_id}", headers=tenant.headers).status_code == 200
    again = client.delete(f"/v1/keys/{other['id']}", headers={"Authorization": f"Bearer {other['key']}"})
    assert again.status_code == 409  # the other one is now the last
    assert (
        client.delete(f"/v1/admin/keys/{other['id']}", headers=ADMIN).status_code == 200
    )  # the operator may


def test_key_calls_count_against_requests_per_min_like_inference(
    client: TestClient, new_tenant: Callable[[str], TenantHandle]
) -> None:
    from api.ratelimit import InMemoryRateLimiter

    client.app.state.services.rate_limiter = InMemoryRateLimiter(clock=lambda: 1_000_000.0)  # type: ignore[attr-defined]
    plan = client.post(
        "/v1/admin/plans", json={"name": "five-a-minute", "requests_per_min": 5}, headers=ADMIN
    )
    tenant = new_tenant("key-spammer")
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"plan_id": plan.json()["id"]}, headers=ADMIN)
    _allow_key_management(client, tenant)
    statuses = [client.post("/v1/keys", headers=tenant.headers).status_code for _ in range(4)]
    statuses.append(client.get("/v1/keys", headers=tenant.headers).status_code)
    assert statuses == [201, 201, 201, 201, 200]
    refused = client.post("/v1/keys", headers=tenant.headers)
    assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60
    assert "rate limit of 5 requests per minute" in refused.json()["error"]["message"]
    assert client.get("/v1/keys", headers=tenant.headers).status_code == 429
    completion = client.post("/v1/completions", json={"model": "x", "prompt": "hi"}, headers=tenant.headers)
    assert completion.status_code == 429  # one budget for keys and inference
    assert len(client.get("/v1/keys", headers=new_tenant("other").headers).json()["data"]) == 1  # per tenant
