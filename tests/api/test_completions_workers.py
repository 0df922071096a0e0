"""Inference routes over HTTP with scripted workers: worker failures and retries, adapter versions and routing,
tenancy, and what is metered when a request fails.

Request handling and response shapes are in test_completions.py.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from scheduler.routing.router_policies import make_router
from tests.api.conftest import TenantHandle
from tests.api.test_completions_support import (
    BASE_MODEL,
    ScriptedWorkers,
    add_ready_version,
    complete,
    delta,
    sse_events,
    usage_rows,
)


def test_no_live_worker_is_a_503_with_retry_after_and_metered_rejected(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    response = complete(client, tenant)
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert "no live worker serves it" in response.json()["error"]["message"]
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("rejected", 0, 0)


def test_unreachable_worker_is_retried_once_on_another(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    down = workers.add("a-down", is_down=True)  # least loaded: chosen first
    draining = workers.add("b-draining", status_code=503, error_type="draining", num_running=1)
    healthy = workers.add("c-healthy", num_running=2)
    response = complete(client, tenant)
    assert response.status_code == 503  # two attempts: a-down then b-draining
    assert len(draining.requests) == 1 and healthy.requests == []
    draining.status_code = 200
    down.is_down = False
    down.status_code, down.error_type = 503, "overloaded"
    assert complete(client, tenant).status_code == 200  # a-down refuses, b-draining serves
    assert [r.status for r in usage_rows(db_session, tenant.id)] == ["rejected", "ok"]
    assert usage_rows(db_session, tenant.id)[1].worker_id == "b-draining"


def test_worker_bad_request_before_streaming_maps_to_400_metered_error(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    workers.add("w1", status_code=400, error_type="bad_request")
    response = complete(client, tenant)
    assert response.status_code == 400 and "bad_request" in response.json()["error"]["message"]
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens, row.worker_id) == ("error", 0, "w1")


def test_worker_error_mid_stream_bills_what_was_delivered_once(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    events = [delta("a", 1), delta("b", 2), {"type": "error", "code": "internal", "message": "engine died"}]
    workers.add("w1", events=events)
    with client.stream(
        "POST",
        "/v1/completions",
        headers=tenant.headers,
        json={"model": BASE_MODEL, "prompt": "hi", "stream": True},
    ) as response:
        chunks = sse_events(response.read().decode())
    assert [c["choices"][0]["text"] for c in chunks[:2]] == ["a", "b"]
    assert "engine died" in chunks[2]["error"]["message"] and chunks[-1] == "[DONE]"
    non_stream = complete(client, tenant)
    assert non_stream.status_code == 502
    rows = usage_rows(db_session, tenant.id)
    assert [(r.status, r.completion_tokens) for r in rows] == [("error", 2), ("error", 0)]
    assert rows[0].prompt_tokens > 0 and "engine died" in rows[0].error_message


def test_stream_without_final_event_is_an_error(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    workers.add("w1", events=[delta("a", 1)])
    assert complete(client, tenant).status_code == 502
    assert [r.status for r in usage_rows(db_session, tenant.id)] == ["error"]


def test_version_pinning_sends_that_versions_key_and_meters_it(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    worker = workers.add("w1")
    v1 = add_ready_version(db_session, tenant.id, "summarize")
    v2 = add_ready_version(db_session, tenant.id, "summarize")
    for model in ("summarize@1", "summarize@2", "summarize"):
        assert complete(client, tenant, model=model).json()["model"] == model
    assert [r.adapter.adapter_key for r in worker.requests] == [v1.id, v2.id, v2.id]
    assert worker.requests[0].adapter.weights_blob_key == v1.weights_blob_key
    rows = usage_rows(db_session, tenant.id)
    assert [r.adapter_version_id for r in rows] == [v1.id, v2.id, v2.id]
    assert {r.model_name for r in rows} == {"summarize"}
    assert complete(client, tenant, model="summarize@3").status_code == 404


def test_adapter_ref_carries_both_file_digests_of_the_version(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    worker = workers.add("w1")
    version = add_ready_version(db_session, tenant.id, "digests")
    version.config_sha256 = "c" * 64
    db_session.commit()
    add_ready_version(db_session, tenant.id, "legacy")  # a row from before migration 0002: no config digest
    assert complete(client, tenant, model="digests").status_code == 200
    assert complete(client, tenant, model="legacy").status_code == 200
    sent, legacy = (r.adapter for r in worker.requests)
    assert (sent.sha256, sent.config_sha256) == (version.sha256, "c" * 64)
    assert legacy.config_sha256 is None  # the worker caches it under its version id alone


def test_residency_router_routes_to_the_worker_holding_the_adapter(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    client.app.state.services.worker_client.router = make_router("residency_least_loaded")  # type: ignore[attr-defined]
    version = add_ready_version(db_session, tenant.id, "tuned")
    idle = workers.add("idle")
    warm = workers.add("warm", num_running=3, device_adapters=(version.id,))
    assert complete(client, tenant, model="tuned").status_code == 200
    assert len(warm.requests) == 1 and idle.requests == []
    assert complete(client, tenant).status_code == 200  # base model: least loaded
    assert len(idle.requests) == 1


def test_default_router_prefers_the_adapters_worker_only_within_the_load_gap(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    # holders_least_loaded: residency decides among workers within 0.0625 of the least load (batch slots 8)
    version = add_ready_version(db_session, tenant.id, "tuned")
    idle = workers.add("idle")
    busy = workers.add("busy", num_running=3, device_adapters=(version.id,))
    assert complete(client, tenant, model="tuned").status_code == 200
    assert len(idle.requests) == 1 and busy.requests == []
    workers.add("warm", device_adapters=(version.id,))
    assert complete(client, tenant, model="tuned").status_code == 200
    assert len(workers.workers["warm.workers.test"].requests) == 1


def test_other_tenants_private_adapter_is_404_and_public_ones_are_usable(
    client: TestClient,
    workers: ScriptedWorkers,
    new_tenant: Callable[[str], TenantHandle],
    db_session: Session,
) -> None:
    worker = workers.add("w1")
    owner, other = new_tenant("owner"), new_tenant("other")
    add_ready_version(db_session, owner.id, "secret")
    shared = add_ready_version(db_session, owner.id, "shared", visibility="public")
    response = complete(client, other, model="secret")
    assert response.status_code == 404 and "not found" in response.json()["error"]["message"]
    assert complete(client, other, model="shared").status_code == 200
    assert worker.requests[-1].adapter.adapter_key == shared.id
    assert worker.requests[-1].adapter.owner_id == owner.id  # workers scope cached files to the owner
    rows = usage_rows(db_session, other.id)
    assert [(r.status, r.adapter_version_id) for r in rows] == [("rejected", None), ("ok", shared.id)]
    assert usage_rows(db_session, owner.id) == []  # the caller pays, not the adapter's owner


def test_adapter_path_alias(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    worker = workers.add("w1")
    v1 = add_ready_version(db_session, tenant.id, "alias")
    add_ready_version(db_session, tenant.id, "alias")
    response = client.post(
        "/v1/adapters/alias/completions", json={"prompt": "hi", "model": "alias@1"}, headers=tenant.headers
    )
    assert response.status_code == 200, response.text
    assert worker.requests[-1].adapter.adapter_key == v1.id
    mismatch = client.post(
        "/v1/adapters/alias/completions", json={"prompt": "hi", "model": "other"}, headers=tenant.headers
    )
    assert mismatch.status_code == 400


def test_unauthenticated_requests_are_not_metered(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    response = client.post("/v1/completions", json={"model": BASE_MODEL, "prompt": "x"})
    assert response.status_code == 401
    assert usage_rows(db_session, tenant.id) == []
