"""Issue 33 item 5: a base model's names (its name and aliases, removed models included) are reserved against
tenants' adapters and the other way round, and a request for a base-model name never reaches an adapter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from registry.base_model_catalog import add_base_model
from registry.errors import ConflictError
from registry.storage import LocalBlobStore
from tests.api.conftest import ADMIN, TenantHandle, adapter_paths, upload
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, add_ready_version, usage_rows

REMOVED = "tiny-second"


@pytest.fixture
def removed_model(
    client: TestClient, db_session: Session, blob_store: LocalBlobStore, base_model_dir: Path
) -> str:
    """Catalog model `tiny-second` (alias tiny-second-alias) added, then removed by the operator."""
    add_base_model(db_session, blob_store, REMOVED, base_model_dir, aliases=("tiny-second-alias",))
    db_session.commit()
    removed = client.delete(f"/v1/admin/models/{REMOVED}", headers=ADMIN)
    assert removed.status_code == 200 and removed.json()["status"] == "removed"
    return REMOVED


@pytest.mark.parametrize("name", [REMOVED, "tiny-second-alias", "TINY-SECOND"])
def test_a_removed_models_names_cannot_be_taken_by_an_uploaded_adapter(
    client: TestClient,
    new_tenant: Callable[[str], TenantHandle],
    demo_adapter: Path,
    removed_model: str,
    name: str,
) -> None:
    tenant_b = new_tenant("tenant-b")
    refused = upload(
        client, tenant_b, name, adapter_paths(demo_adapter), visibility="public", base_model=BASE_MODEL
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    if name.islower():  # an upper-case name breaks the adapter rule first
        assert error["type"] == "name_reserved" and "removed from the catalog" in error["message"]
    assert client.get("/v1/adapters?include_public=true", headers=tenant_b.headers).json()["data"] == []


def test_an_import_under_a_reserved_name_is_refused_before_the_source_is_read(
    client: TestClient, new_tenant: Callable[[str], TenantHandle], removed_model: str
) -> None:
    tenant_b = new_tenant("tenant-b")
    body = {"name": removed_model, "source": "https://example.invalid/a.zip", "visibility": "public"}
    refused = client.post("/v1/adapters", json=body, headers=tenant_b.headers)
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "name_reserved", refused.text


def test_a_request_for_a_removed_model_never_reaches_a_tenants_adapter(
    client: TestClient,
    workers: ScriptedWorkers,
    new_tenant: Callable[[str], TenantHandle],
    db_session: Session,
    removed_model: str,
) -> None:
    """The issue's scenario, with B's public adapter already there (it was published before this fix)."""
    tenant_b, tenant_c = new_tenant("tenant-b"), new_tenant("tenant-c")
    add_ready_version(db_session, tenant_b.id, removed_model, visibility="public")
    worker = workers.add("w1")
    for model in (removed_model, f"{removed_model}@1", "tiny-second-alias"):
        response = client.post(
            "/v1/completions", json={"model": model, "prompt": "hi"}, headers=tenant_c.headers
        )
        assert response.status_code == 404, response.text
        assert response.json()["error"]["type"] == "model_removed"
        assert "was removed from the catalog" in response.json()["error"]["message"]
    assert worker.requests == []
    rows = usage_rows(db_session, tenant_c.id)
    assert [r.status for r in rows] == ["rejected"] * 3 and all(r.adapter_id is None for r in rows)
    assert all(r.prompt_tokens == r.completion_tokens == 0 for r in rows)


def test_a_live_models_alias_serves_the_base_model_not_an_adapter(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    blob_store: LocalBlobStore,
    base_model_dir: Path,
) -> None:
    add_base_model(db_session, blob_store, BASE_MODEL, base_model_dir, aliases=("org/Base-Model",))
    db_session.commit()
    worker = workers.add("w1")
    response = client.post(
        "/v1/completions", json={"model": "org/base-model", "prompt": "hi"}, headers=tenant.headers
    )
    assert response.status_code == 200, response.text
    assert worker.requests[0].adapter is None


def test_a_model_or_alias_cannot_take_a_live_adapters_name(
    db_session: Session, blob_store: LocalBlobStore, base_model_dir: Path, tenant: TenantHandle
) -> None:
    add_ready_version(db_session, tenant.id, "tuned", visibility="public")
    with pytest.raises(ConflictError, match="adapter of tenant 'acme'"):
        add_base_model(db_session, blob_store, "tuned", base_model_dir)
    db_session.rollback()
    with pytest.raises(ConflictError, match="adapter of tenant 'acme'"):
        add_base_model(db_session, blob_store, "tiny-x", base_model_dir, aliases=("tuned",))


def test_an_undecodable_model_name_is_a_404_without_a_database_error(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    workers.add("w1")
    response = client.post(
        "/v1/completions", json={"model": "a\u0000b", "prompt": "hi"}, headers=tenant.headers
    )
    assert response.status_code == 404 and response.json()["error"]["type"] == "model_not_found"
    [row] = usage_rows(db_session, tenant.id)
    assert row.status == "rejected"
