"""POST /v1/adapters with two base models of different shapes: the `base_model` form field (and the JSON import
field) binds the adapter; an unknown or missing base is a 400 and a shape mismatch a 422, each listing the
available bases; the adapter's card names its base."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from registry.base_model_catalog import add_base_model
from registry.storage import LocalBlobStore
from tests.api.conftest import TenantHandle, adapter_paths, upload

LOCAL = "lorahost-base"  # the configured model of the test settings (settings.base_model_name)
WIDE = "wide"


def _add_wide(db_session: Session, blob_store: LocalBlobStore, wide_demo_dir: Path) -> Path:
    add_base_model(db_session, blob_store, WIDE, wide_demo_dir / "base")
    db_session.commit()
    return min((wide_demo_dir / "adapters").iterdir())


def test_the_form_field_binds_the_adapter_to_its_base(
    client: TestClient,
    db_session: Session,
    blob_store: LocalBlobStore,
    wide_demo_dir: Path,
    tenant: TenantHandle,
) -> None:
    wide_adapter = _add_wide(db_session, blob_store, wide_demo_dir)
    accepted = upload(client, tenant, "wide-lora", adapter_paths(wide_adapter), base_model=WIDE)
    assert accepted.status_code == 202, accepted.text
    card = client.get("/v1/adapters/wide-lora", headers=tenant.headers).json()
    assert card["base_model"] == WIDE and card["versions"][-1]["status"] == "ready"


def test_missing_unknown_and_wrong_bases_are_refused_with_the_list(
    client: TestClient,
    db_session: Session,
    blob_store: LocalBlobStore,
    wide_demo_dir: Path,
    demo_adapter: Path,
    tenant: TenantHandle,
) -> None:
    wide_adapter = _add_wide(db_session, blob_store, wide_demo_dir)
    listed = f"['{LOCAL}', '{WIDE}']"
    missing = upload(client, tenant, "a", adapter_paths(demo_adapter))  # its config names neither
    assert missing.status_code == 400 and "base_model_required" in missing.text and listed in missing.text
    unknown = upload(client, tenant, "a", adapter_paths(demo_adapter), base_model="gpt-9")
    assert unknown.status_code == 400 and "unknown_base_model" in unknown.text and listed in unknown.text
    wrong = upload(client, tenant, "a", adapter_paths(wide_adapter), base_model=LOCAL)
    assert wrong.status_code == 422 and listed in wrong.text and f"it fits ['{WIDE}']" in wrong.text
    assert client.get("/v1/adapters", headers=tenant.headers).json()["data"] == []
    ok = upload(client, tenant, "a", adapter_paths(demo_adapter), base_model=LOCAL)
    assert (
        ok.status_code == 202
        and client.get("/v1/adapters/a", headers=tenant.headers).json()["base_model"] == LOCAL
    )


def test_an_import_names_its_base_in_json(client: TestClient, tenant: TenantHandle) -> None:
    refused = client.post(
        "/v1/adapters",
        json={"name": "imp", "source": "https://example.invalid/a.zip", "base_model": 7},
        headers=tenant.headers,
    )
    assert refused.status_code in (400, 422) and "base_model" in refused.text
