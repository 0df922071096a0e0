"""/v1/admin: tenants, keys, plans."""

from __future__ import annotations

import pytest

from tests.api.conftest import ADMIN


def test_creates_and_lists_tenants(client) -> None:
    created = client.post("/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN)
    assert created.status_code == 201
    body = created.json()
    assert body["name"] == "acme" and body["is_active"] is True and len(body["id"]) == 36
    listed = client.get("/v1/admin/tenants", headers=ADMIN).json()
    assert listed["object"] == "list" and [t["id"] for t in listed["data"]] == [body["id"]]


def test_tenant_name_is_required(client) -> None:
    response = client.post("/v1/admin/tenants", json={}, headers=ADMIN)
    assert response.status_code == 422 and "name" in response.json()["error"]["message"]


def test_patch_changes_only_the_fields_sent(client) -> None:
    plan = client.post(
        "/v1/admin/plans", json={"name": "pro", "price_per_1m_prompt_tokens": "0.25"}, headers=ADMIN
    )
    assert plan.status_code == 201 and plan.json()["slo_percentile"] == 99.0
    tenant = client.post("/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN).json()
    with_plan = client.patch(
        f"/v1/admin/tenants/{tenant['id']}", json={"plan_id": plan.json()["id"]}, headers=ADMIN
    )
    assert with_plan.json()["plan_id"] == plan.json()["id"] and with_plan.json()["is_active"] is True
    disabled = client.patch(f"/v1/admin/tenants/{tenant['id']}", json={"is_active": False}, headers=ADMIN)
    assert disabled.json()["is_active"] is False and disabled.json()["plan_id"] == plan.json()["id"]
    cleared = client.patch(f"/v1/admin/tenants/{tenant['id']}", json={"plan_id": None}, headers=ADMIN)
    assert cleared.json()["plan_id"] is None
    assert [p["name"] for p in client.get("/v1/admin/plans", headers=ADMIN).json()["data"]] == ["pro"]


def test_unknown_plan_or_tenant_is_404(client) -> None:
    tenant = client.post("/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN).json()
    assert (
        client.patch(f"/v1/admin/tenants/{tenant['id']}", json={"plan_id": "nope"}, headers=ADMIN).status_code
        == 404
    )
    assert client.patch("/v1/admin/tenants/nope", json={"is_active": False}, headers=ADMIN).status_code == 404
    assert client.post("/v1/admin/tenants/nope/keys", headers=ADMIN).status_code == 404
    assert client.delete("/v1/admin/keys/nope", headers=ADMIN).status_code == 404


def test_key_is_shown_once_in_lh_format_and_revocation_is_idempotent(client) -> None:
    tenant = client.post("/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN).json()
    key = client.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json()
    assert key["key"].startswith(f"lh_{key['id']}_") and key["tenant_id"] == tenant["id"]
    first = client.delete(f"/v1/admin/keys/{key['id']}", headers=ADMIN).json()
    second = client.delete(f"/v1/admin/keys/{key['id']}", headers=ADMIN).json()
    assert first["revoked_at"] is not None and first["revoked_at"] == second["revoked_at"]
    assert "key" not in first


def test_duplicate_plan_name_is_409_naming_it(client) -> None:
    assert client.post("/v1/admin/plans", json={"name": "pro"}, headers=ADMIN).status_code == 201
    again = client.post("/v1/admin/plans", json={"name": "pro", "requests_per_min": 5}, headers=ADMIN)
    assert again.status_code == 409, again.text
    assert "'pro'" in again.json()["error"]["message"]
    assert [p["name"] for p in client.get("/v1/admin/plans", headers=ADMIN).json()["data"]] == ["pro"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("requests_per_min", 2**66),
        ("requests_per_min", 2**31),
        ("tokens_per_min", 0),
        ("requests_per_min", -1),
        ("price_per_1m_prompt_tokens", "-0.01"),
        ("price_per_1m_completion_tokens", "1e13"),
        ("price_storage_per_adapter_day", "0.0000001"),
        ("price_per_1m_prompt_tokens", "NaN"),
        ("slo_ttft_ms", 0),
        ("slo_tpot_ms", -5.0),
        ("slo_percentile", 0),
        ("slo_percentile", 100.5),
        ("fair_share_weight", 0),
        ("fair_share_weight", -1.0),
        ("fair_share_weight", 0.0001),
        ("fair_share_weight", 1000.5),
    ],
)
def test_out_of_range_plan_values_are_422_naming_the_field(client, field: str, value: object) -> None:
    response = client.post("/v1/admin/plans", json={"name": "bad", field: value}, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert field in response.json()["error"]["message"]
    assert client.get("/v1/admin/plans", headers=ADMIN).json()["data"] == []


def test_plan_values_at_the_ends_of_their_range_are_accepted(client) -> None:
    body = {
        "name": "edge",
        "requests_per_min": 2**31 - 1,
        "tokens_per_min": 1,
        "price_per_1m_prompt_tokens": "999999999999.999999",
        "price_per_1m_completion_tokens": "0",
        "slo_ttft_ms": 0.001,
        "slo_percentile": 100,
        "fair_share_weight": 1000,
    }
    response = client.post("/v1/admin/plans", json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    assert response.json()["requests_per_min"] == 2**31 - 1
    assert response.json()["fair_share_weight"] == 1000
    lightest = client.post(
        "/v1/admin/plans", json={"name": "light", "fair_share_weight": 0.001}, headers=ADMIN
    )
    assert lightest.status_code == 201, lightest.text
    assert response.json()["price_per_1m_prompt_tokens"] == "999999999999.999999"


@pytest.mark.parametrize(
    ("method", "route", "body"),
    [
        ("post", "/v1/admin/tenants", {"name": "a\u0000b"}),
        ("post", "/v1/admin/tenants", {"name": "line\nbreak"}),
        ("post", "/v1/admin/tenants", {"name": "acme", "plan_id": "a\u0000b"}),
        ("post", "/v1/admin/plans", {"name": "a\u0000b"}),
        ("post", "/v1/admin/tenants/a%00b/keys", None),
        ("patch", "/v1/admin/tenants/a%00b", {"is_active": False}),
        ("delete", "/v1/admin/keys/a%00b", None),
    ],
)
def test_control_characters_in_admin_names_and_ids_are_422(client, method: str, route: str, body) -> None:  # type: ignore[no-untyped-def]
    # PostgreSQL text cannot hold NUL: on main these were 500s there (and stored on SQLite)
    response = client.request(method, route, json=body, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert client.get("/v1/admin/tenants", headers=ADMIN).json()["data"] == []
