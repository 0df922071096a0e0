"""The API per base model (issue 24 item 4) with two base models of different shapes and tokenizers: /v1/models
lists both with adapters' `parent`, a request for a catalog base model by name runs on that model's own
tokenizer (fetched from the blob store, verified) and reaches only that model's workers; usage rows, invoice
lines and SLO groups are per base model, with a model's own prices for a plan."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.prompting import BaseModelTokenizer
from registry.base_model_catalog import add_base_model
from registry.storage import LocalBlobStore
from tests.api.conftest import ADMIN, TenantHandle, adapter_paths, upload
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


def test_usage_and_bills_are_per_base_model_with_the_models_own_prices(
    client: TestClient,
    db_session: Session,
    blob_store: LocalBlobStore,
    wide_demo_dir: Path,
    workers: ScriptedWorkers,
    new_tenant: Callable[[str], TenantHandle],
) -> None:
    add_base_model(db_session, blob_store, WIDE, wide_demo_dir / "base")
    db_session.commit()
    plan = client.post(
        "/v1/admin/plans",
        json={"name": "pro", "price_per_1m_prompt_tokens": 1, "price_per_1m_completion_tokens": 2},
        headers=ADMIN,
    ).json()
    tenant = new_tenant("priced")
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"plan_id": plan["id"]}, headers=ADMIN)
    priced = client.patch(
        f"/v1/admin/models/{WIDE}",
        json={"prices": {"pro": {"per_1m_prompt": "100", "per_1m_completion": "200"}}},
        headers=ADMIN,
    )
    assert priced.status_code == 200 and priced.json()["prices"]["pro"]["per_1m_prompt"] == "100"
    assert (
        client.patch(
            f"/v1/admin/models/{WIDE}", json={"prices": {"pro": {"per_1m_prompt": -1}}}, headers=ADMIN
        ).status_code
        == 422
    )
    workers.add("w-local", events=tokens_events(2))
    workers.add("w-wide", base_model=WIDE, events=tokens_events(2))
    for model in (BASE_MODEL, WIDE):
        body = {"model": model, "prompt": "hello world", "max_tokens": 2}
        assert client.post("/v1/completions", json=body, headers=tenant.headers).status_code == 200
    rows = {r.base_model_name: r for r in usage_rows(db_session, tenant.id)}
    assert set(rows) == {BASE_MODEL, WIDE}
    today = datetime.now(UTC).date()
    period = {"start": today.isoformat(), "end": (today + timedelta(days=1)).isoformat()}
    bill = client.get("/v1/admin/billing", params=period, headers=ADMIN).json()["data"]
    lines = {line["base_model"]: line for line in bill if line["tenant_id"] == tenant.id}
    assert set(lines) == {BASE_MODEL, WIDE}
    for base, per_1m_prompt in ((BASE_MODEL, 1), (WIDE, 100)):
        row, line = rows[base], lines[base]
        assert (line["prompt_tokens"], line["completion_tokens"]) == (row.prompt_tokens, 2)
        assert Decimal(line["prompt_cost"]) == (Decimal(row.prompt_tokens * per_1m_prompt) / 10**6).quantize(
            Decimal("0.000001")
        )
    slo = client.get("/v1/admin/slo", params={**period, "group_by": "base_model"}, headers=ADMIN).json()[
        "data"
    ]
    assert {g["key"] for g in slo} >= {BASE_MODEL, WIDE}
