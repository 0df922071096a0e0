"""The API per base model (issue 24 item 4) with two base models of different shapes and tokenizers: /v1/models
lists both with adapters' `parent`, a request for a catalog base model by name runs on that model's own
tokenizer (fetched from the blob store, verified) and reaches only that model's workers."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.prompting import BaseModelTokenizer
from registry.base_model_catalog import add_base_model
from registry.storage import LocalBlobStore
from tests.api.conftest import TenantHandle, adapter_paths, upload
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, tokens_events, usage_rows

WIDE = "wide"


def test_models_lists_every_base_and_each_adapters_parent(
    client: TestClient,
    db_session: Session,
    blob_store: LocalBlobStore,
    wide_demo_dir: Path,
    tenant: TenantHandle,
) -> None:
    add_base_model(db_session, blob_store, WIDE, wide_demo_dir / "base")
    db_session.commit()
    wide_adapter = min((wide_demo_dir / "adapters").iterdir())
    assert upload(client, tenant, "w-lora", adapter_paths(wide_adapter), base_model=WIDE).status_code == 202
    cards = {c["id"]: c for c in client.get("/v1/models", headers=tenant.headers).json()["data"]}
    assert {BASE_MODEL, WIDE, "w-lora"} <= set(cards)
    assert cards["w-lora"]["parent"] == WIDE and cards[WIDE]["root"] == WIDE and cards[WIDE]["parent"] is None
    assert client.get(f"/v1/models/{WIDE}", headers=tenant.headers).json()["id"] == WIDE


def test_a_catalog_base_model_by_name_uses_its_own_tokenizer_and_workers(
    client: TestClient,
    db_session: Session,
    blob_store: LocalBlobStore,
    wide_demo_dir: Path,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    tokenizer: BaseModelTokenizer,
) -> None:
    add_base_model(db_session, blob_store, WIDE, wide_demo_dir / "base")
    db_session.commit()
    local_worker = workers.add("w-local", events=tokens_events(2))
    wide_worker = workers.add("w-wide", base_model=WIDE, events=tokens_events(2))
    response = client.post(
        "/v1/completions",
        json={"model": WIDE, "prompt": "hello world", "max_tokens": 2},
        headers=tenant.headers,
    )
    assert response.status_code == 200, response.text
    wide_tokenizer = BaseModelTokenizer.load(wide_demo_dir / "base")
    [sent] = wide_worker.requests
    assert sent.prompt_token_ids == wide_tokenizer.encode("hello world") != tokenizer.encode("hello world")
    assert local_worker.requests == []
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.model_name, row.worker_id) == ("ok", WIDE, "w-wide")
    unknown = client.post(
        "/v1/completions", json={"model": "gpt-9", "prompt": "hi", "max_tokens": 2}, headers=tenant.headers
    )
    assert unknown.status_code == 404
