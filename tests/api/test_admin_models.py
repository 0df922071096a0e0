"""/v1/admin/models: the base-model catalog over REST (admin only): list, look up, remove (409 with ready
adapters bound to the model unless force=true)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from registry.base_model_catalog import add_base_model
from registry.storage import LocalBlobStore
from tests.api.conftest import ADMIN, TenantHandle
from tests.api.test_completions_support import BASE_MODEL, add_ready_version


def test_the_catalog_lists_and_shows_models_to_the_admin_only(
    client: TestClient,
    db_session: Session,
    blob_store: LocalBlobStore,
    base_model_dir: Path,
    tenant: TenantHandle,
) -> None:
    add_base_model(db_session, blob_store, "tiny-b", base_model_dir, engines=("native", "vllm"))
    db_session.commit()
    listed = client.get("/v1/admin/models", headers=ADMIN)
    assert listed.status_code == 200 and [m["name"] for m in listed.json()["data"]] == ["tiny-b"]
    card = client.get("/v1/admin/models/tiny-b", headers=ADMIN).json()
    assert card["engines"] == ["native", "vllm"] and card["shape"]["num_layers"] == 2
    assert all(len(f["sha256"]) == 64 for f in card["files"]) and card["num_ready_adapters"] == 0
    missing = client.get("/v1/admin/models/none", headers=ADMIN)
    assert missing.status_code == 404 and "available: ['tiny-b']" in missing.text
    assert client.get("/v1/admin/models", headers=tenant.headers).status_code in (401, 403)


def test_removing_a_model_with_ready_adapters_needs_force(
    client: TestClient,
    db_session: Session,
    blob_store: LocalBlobStore,
    base_model_dir: Path,
    tenant: TenantHandle,
) -> None:
    add_base_model(db_session, blob_store, BASE_MODEL, base_model_dir)
    db_session.commit()
    add_ready_version(db_session, tenant.id, "tuned")  # bound to BASE_MODEL
    refused = client.delete(f"/v1/admin/models/{BASE_MODEL}", headers=ADMIN)
    assert refused.status_code == 409 and "1 ready adapter" in refused.text
    assert client.get(f"/v1/admin/models/{BASE_MODEL}", headers=ADMIN).json()["num_ready_adapters"] == 1
    removed = client.delete(f"/v1/admin/models/{BASE_MODEL}", params={"force": "true"}, headers=ADMIN)
    assert removed.status_code == 200 and removed.json()["status"] == "removed"
    assert client.get("/v1/admin/models", headers=ADMIN).json()["data"] == []


def test_the_catalog_pages_by_name_and_a_removed_models_name_still_continues(
    client: TestClient, db_session: Session, blob_store: LocalBlobStore, base_model_dir: Path
) -> None:
    for name in ("tiny-c", "tiny-a", "tiny-b"):
        add_base_model(db_session, blob_store, name, base_model_dir)
    db_session.commit()
    first = client.get("/v1/admin/models", params={"limit": 1}, headers=ADMIN).json()
    assert [m["name"] for m in first["data"]] == ["tiny-a"] and first["last_id"] == "tiny-a"
    assert first["has_more"]
    second = client.get("/v1/admin/models", params={"limit": 1, "after": "tiny-a"}, headers=ADMIN).json()
    assert [m["name"] for m in second["data"]] == ["tiny-b"] and second["has_more"]
    removed = client.delete("/v1/admin/models/tiny-b", headers=ADMIN)
    assert removed.status_code == 200
    last = client.get("/v1/admin/models", params={"limit": 1, "after": "tiny-b"}, headers=ADMIN).json()
    assert [m["name"] for m in last["data"]] == ["tiny-c"] and not last["has_more"]
    whole = client.get("/v1/admin/models", params={"limit": 1000}, headers=ADMIN).json()
    assert [m["name"] for m in whole["data"]] == ["tiny-a", "tiny-c"]
    assert (whole["first_id"], whole["last_id"], whole["has_more"]) == ("tiny-a", "tiny-c", False)
