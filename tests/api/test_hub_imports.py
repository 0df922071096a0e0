"""POST /v1/adapters {"source": "hf://org/name[@revision]"} end to end against a local fake Hub (issue 39 item 3):
the validation job runs and the version records the commit; a private repository needs the tenant's own
hf_token, which is never stored, logged or returned; the plan's storage is checked before a byte is
downloaded; every unreadable repository gets the same error."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session

from registry import repository
from registry.models import Adapter, AdapterVersion
from registry.storage import LocalBlobStore
from registry.validation import CONFIG_FILENAME, WEIGHTS_FILENAME
from tests.api.conftest import ADMIN, TenantHandle
from tests.registry.fake_hub import *  # the fake_hub fixture
from tests.registry.fake_hub import FakeHub

HUB_TOKEN = "hf_tenant_token_never_echoed"


def _adapter_files(demo_adapter: Path) -> dict[str, bytes]:
    files = {name: (demo_adapter / name).read_bytes() for name in (CONFIG_FILENAME, WEIGHTS_FILENAME)}
    return files | {"README.md": b"# a LoRA", ".gitattributes": b"*.safetensors filter=lfs"}


def _import(client: TestClient, tenant: TenantHandle, source: str, **fields: object):  # type: ignore[no-untyped-def]
    return client.post(
        "/v1/adapters", json={"name": "hub-lora", "source": source} | fields, headers=tenant.headers
    )


def _assert_nothing_stored(db_session: Session, blob_store: LocalBlobStore) -> None:
    db_session.expire_all()
    assert blob_store.list_keys() == []
    assert repository.count_rows(db_session, AdapterVersion) == 0
    assert repository.count_rows(db_session, Adapter) == 0


def test_public_hub_import_runs_the_job_and_records_the_commit(
    make_client, new_tenant, fake_hub: FakeHub, demo_adapter, db_session, blob_store
) -> None:
    commit = fake_hub.add_repo("org/lora", _adapter_files(demo_adapter))
    client = make_client(import_hf_endpoint=fake_hub.url)
    tenant = new_tenant("importer")
    response = _import(client, tenant, "hf://org/lora")
    assert response.status_code == 202, response.text
    version = response.json()["version"]
    assert version["status"] == "ready" and version["source_revision"] == commit
    shown = client.get("/v1/adapters/hub-lora", headers=tenant.headers).json()
    assert shown["versions"][0]["source_revision"] == commit
    db_session.expire_all()
    row = db_session.get(AdapterVersion, version["id"])
    assert row is not None and (row.source_uri, row.source_revision) == ("hf://org/lora", commit)
    assert all(f"/resolve/{commit}/" in r.path for r in fake_hub.seen("resolve"))
    assert len(blob_store.list_keys()) == 2


def test_hub_import_at_a_revision_reads_that_commit(make_client, new_tenant, fake_hub, demo_adapter) -> None:
    files = _adapter_files(demo_adapter)
    first = fake_hub.add_repo("org/lora", files)
    fake_hub.push("org/lora", files, ref="v1")
    fake_hub.push("org/lora", files | {"README.md": b"# moved on"})  # main moves on
    client = make_client(import_hf_endpoint=fake_hub.url)
    response = _import(client, new_tenant("importer"), "hf://org/lora@v1")
    assert response.status_code == 202, response.text
    assert response.json()["version"]["source_revision"] == first


def test_private_hub_import_uses_the_tenants_token_and_never_keeps_it(
    make_client, new_tenant, fake_hub, demo_adapter, db_session, caplog
) -> None:
    commit = fake_hub.add_repo("org/private", _adapter_files(demo_adapter), token=HUB_TOKEN)
    client = make_client(import_hf_endpoint=fake_hub.url)
    tenant = new_tenant("importer")
    with caplog.at_level(logging.DEBUG):
        response = _import(client, tenant, "hf://org/private", hf_token=HUB_TOKEN)
        listed = client.get("/v1/adapters/hub-lora", headers=tenant.headers)
    assert response.status_code == 202 and response.json()["version"]["source_revision"] == commit, (
        response.text
    )
    assert set(fake_hub.authorizations()) == {f"Bearer {HUB_TOKEN}"}
    assert HUB_TOKEN not in response.text and HUB_TOKEN not in listed.text
    assert HUB_TOKEN not in caplog.text
    db_session.expire_all()
    for table in ("adapter_versions", "adapters"):
        rows = db_session.execute(text(f"SELECT * FROM {table}")).all()
        assert rows and HUB_TOKEN not in repr(rows)


def test_unreadable_hub_repos_get_the_same_error_and_store_nothing(
    make_client, new_tenant, fake_hub, demo_adapter, db_session, blob_store, monkeypatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)  # the platform's environment: never sent for a tenant
    fake_hub.add_repo("org/private", _adapter_files(demo_adapter), token=HUB_TOKEN)
    fake_hub.add_repo("org/public", _adapter_files(demo_adapter))
    client = make_client(import_hf_endpoint=fake_hub.url)
    tenant = new_tenant("prober")
    responses = [
        _import(client, tenant, "hf://org/private"),  # private, no token: not even the platform's
        _import(client, tenant, "hf://org/private", hf_token="hf_wrong"),
        _import(client, tenant, "hf://org/missing"),
        _import(client, tenant, "hf://org/public@no-such-branch"),
    ]
    assert {(r.status_code, r.text) for r in responses} == {(responses[0].status_code, responses[0].text)}
    assert responses[0].status_code == 400 and responses[0].json()["error"]["type"] == "source_unreadable"
    assert fake_hub.authorizations() == ["Bearer hf_wrong"] * len(fake_hub.authorizations())
    assert fake_hub.seen("resolve") == []
    _assert_nothing_stored(db_session, blob_store)


def test_hub_import_past_the_plans_storage_is_refused_before_a_byte_is_downloaded(
    make_client, new_tenant, fake_hub, demo_adapter, db_session, blob_store
) -> None:
    files = _adapter_files(demo_adapter)
    fake_hub.add_repo("org/lora", files)
    client = make_client(import_hf_endpoint=fake_hub.url)
    plan = client.post(
        "/v1/admin/plans",
        json={"name": f"small-{uuid.uuid4().hex[:6]}", "max_stored_bytes": len(files[WEIGHTS_FILENAME]) - 1},
        headers=ADMIN,
    )
    tenant = new_tenant("small")
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"plan_id": plan.json()["id"]}, headers=ADMIN)
    response = _import(client, tenant, "hf://org/lora")
    assert response.status_code == 413, response.text
    assert response.json()["error"]["type"] == "storage_quota_exceeded"
    assert "max_stored_bytes" in response.json()["error"]["message"]
    assert fake_hub.seen("revision") and fake_hub.seen("resolve") == []
    _assert_nothing_stored(db_session, blob_store)


def test_hub_import_over_the_upload_limit_or_without_weights_is_refused(
    make_client, new_tenant, fake_hub, demo_adapter, db_session, blob_store
) -> None:
    files = _adapter_files(demo_adapter)
    fake_hub.add_repo("org/lora", files)
    fake_hub.add_repo("org/half", {CONFIG_FILENAME: files[CONFIG_FILENAME]})
    client = make_client(import_hf_endpoint=fake_hub.url, max_upload_bytes=len(files[WEIGHTS_FILENAME]))
    tenant = new_tenant("importer")
    too_large = _import(client, tenant, "hf://org/lora")
    assert too_large.status_code == 413 and too_large.json()["error"]["type"] == "upload_too_large"
    missing = _import(client, tenant, "hf://org/half")
    assert missing.status_code == 400 and missing.json()["error"]["type"] == "missing_weights", missing.text
    assert fake_hub.seen("resolve") == []
    _assert_nothing_stored(db_session, blob_store)


def test_hub_import_form_errors_name_the_accepted_forms(make_client, new_tenant, fake_hub) -> None:
    client = make_client(import_hf_endpoint=fake_hub.url)
    tenant = new_tenant("importer")
    bad = _import(client, tenant, "hf://just-a-name")
    assert bad.status_code == 400 and "hf://org/name@revision" in bad.json()["error"]["message"]
    both = _import(
        client,
        tenant,
        "hf://org/lora",
        hf_token=HUB_TOKEN,
        credentials={"access_key_id": "k", "secret_access_key": "s"},
    )
    assert both.status_code == 400 and HUB_TOKEN not in both.text
    off = make_client(import_hf_endpoint=fake_hub.url, is_import_hf_enabled=False)
    refused = _import(off, tenant, "hf://org/lora")
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "source_not_allowed"
    assert fake_hub.requests == []


def test_a_refused_hf_token_is_never_echoed(make_client, new_tenant, fake_hub) -> None:
    client = make_client(import_hf_endpoint=fake_hub.url)
    tenant = new_tenant("importer")
    long_token = "hf_" + "x" * 2000  # past the field's 1024 characters: a 422
    responses = [
        _import(client, tenant, "hf://org/lora", hf_token=long_token),
        _import(client, tenant, "hf://org/lora", hf_token=""),
        _import(client, tenant, "s3://bucket/lora", hf_token=HUB_TOKEN),  # hf_token for another source: a 400
    ]
    assert [r.status_code for r in responses] == [422, 422, 400]
    assert all(long_token[:40] not in r.text and HUB_TOKEN not in r.text for r in responses)
    assert fake_hub.requests == []
