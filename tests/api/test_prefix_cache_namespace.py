"""The prefix-cache namespace the API gives each request (api/inference/prepare.py): the tenant's own, or
the shared one an operator put the tenant in through the admin API; never one the tenant chooses.

Scripted workers check what reaches the worker; an embedded worker with the tiny model checks that another
tenant's repeat of a prompt gets no cached KV (no TTFT side channel) while a tenant's own repeat, and tenants
an operator put in one namespace, do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpu_workers.worker.embedded import EmbeddedWorker
from tests.api.conftest import ADMIN, TenantHandle, create_tenant, upload
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers

PROMPT = "the tenant cache memory batch queue worker latency " * 8  # several full KV blocks


@pytest.fixture
def workers(client: TestClient) -> ScriptedWorkers:
    scripted = ScriptedWorkers()
    scripted.install(client)
    scripted.add("w1")
    return scripted


def complete(client: TestClient, tenant: TenantHandle, **extra: object) -> int:
    body = {"model": BASE_MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0, **extra}
    return client.post("/v1/completions", json=body, headers=tenant.headers).status_code


def set_namespace(client: TestClient, tenant: TenantHandle, namespace: str | None) -> dict:
    response = client.patch(
        f"/v1/admin/tenants/{tenant.id}", json={"prefix_cache_namespace": namespace}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_each_request_reaches_the_worker_in_its_tenant_s_own_namespace(
    client: TestClient, workers: ScriptedWorkers, new_tenant: Callable[[str], TenantHandle]
) -> None:
    a, b = new_tenant("a"), new_tenant("b")
    assert (complete(client, a), complete(client, b), complete(client, a)) == (200, 200, 200)
    sent = [(r.tenant_id, r.cache_namespace) for r in workers.workers["w1.workers.test"].requests]
    assert sent == [(a.id, f"tenant:{a.id}"), (b.id, f"tenant:{b.id}"), (a.id, f"tenant:{a.id}")]


def test_an_operator_s_shared_namespace_applies_at_once_and_null_restores_the_tenant_s_own(
    client: TestClient, workers: ScriptedWorkers, new_tenant: Callable[[str], TenantHandle]
) -> None:
    a, b = new_tenant("a"), new_tenant("b")
    assert complete(client, a) == complete(client, b) == 200  # both keys now sit in the auth cache
    assert set_namespace(client, a, "team-1")["prefix_cache_namespace"] == "team-1"
    set_namespace(client, b, "team-1")
    assert complete(client, a) == complete(client, b) == 200
    set_namespace(client, a, None)
    assert complete(client, a) == 200
    sent = [r.cache_namespace for r in workers.workers["w1.workers.test"].requests]
    assert sent[2:] == ["shared:team-1", "shared:team-1", f"tenant:{a.id}"]


def test_a_tenant_cannot_choose_its_namespace(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    for field in ("cache_namespace", "prefix_cache_namespace", "cache_salt"):
        response = client.post(
            "/v1/completions",
            json={"model": BASE_MODEL, "prompt": PROMPT, "max_tokens": 2, field: "victim"},
            headers=tenant.headers,
        )
        assert response.status_code == 400 and field in response.json()["error"]["message"]
    assert not workers.workers["w1.workers.test"].requests


def test_admin_sets_the_namespace_on_create_and_shows_it(client: TestClient) -> None:
    created = client.post(
        "/v1/admin/tenants", json={"name": "a", "prefix_cache_namespace": "team.x_1"}, headers=ADMIN
    )
    assert created.status_code == 201 and created.json()["prefix_cache_namespace"] == "team.x_1"
    own = client.post("/v1/admin/tenants", json={"name": "b"}, headers=ADMIN).json()
    assert own["prefix_cache_namespace"] is None
    listed = {
        t["name"]: t["prefix_cache_namespace"]
        for t in client.get("/v1/admin/tenants", headers=ADMIN).json()["data"]
    }
    assert listed == {"a": "team.x_1", "b": None}
    untouched = client.patch(
        f"/v1/admin/tenants/{created.json()['id']}", json={"is_active": True}, headers=ADMIN
    )
    assert untouched.json()["prefix_cache_namespace"] == "team.x_1"


@pytest.mark.parametrize("bad", ["", "Team", "a b", "x" * 65, "tenant:x", "é", "-lead", "a\n", "a\x00"])
def test_an_invalid_namespace_is_refused_with_the_rule_and_nothing_changes(
    client: TestClient, bad: str
) -> None:
    refused = client.post(
        "/v1/admin/tenants", json={"name": "a", "prefix_cache_namespace": bad}, headers=ADMIN
    )
    assert refused.status_code == 400
    assert "prefix_cache_namespace" in refused.json()["error"]["message"]
    assert "1-64 characters" in refused.json()["error"]["message"]
    assert client.get("/v1/admin/tenants", headers=ADMIN).json()["data"] == []
    tenant = client.post(
        "/v1/admin/tenants", json={"name": "b", "prefix_cache_namespace": "team"}, headers=ADMIN
    )
    patch = client.patch(
        f"/v1/admin/tenants/{tenant.json()['id']}", json={"prefix_cache_namespace": bad}, headers=ADMIN
    )
    assert patch.status_code == 400
    [row] = client.get("/v1/admin/tenants", headers=ADMIN).json()["data"]
    assert row["prefix_cache_namespace"] == "team"


# ---- through an embedded worker with the tiny model ------------------------------------------------------


def hit_tokens(api: TestClient, worker: EmbeddedWorker, tenant: TenantHandle, model: str) -> int:
    """Send PROMPT as `tenant` to `model`; the prompt tokens the engine found in its prefix cache."""
    service = worker.runtime.require_service()
    before = service.engine.engine_stats().num_prefix_cache_hit_tokens
    assert complete(api, tenant, model=model) == 200
    return service.engine.engine_stats().num_prefix_cache_hit_tokens - before


@pytest.mark.slow
def test_embedded_worker_isolates_tenants_and_shares_an_operator_s_namespace(
    embedded: tuple[TestClient, EmbeddedWorker], demo_adapter: Path
) -> None:
    api, worker = embedded
    a, b = create_tenant(api, "a"), create_tenant(api, "b")
    files = [demo_adapter / "adapter_config.json", demo_adapter / "adapter_model.safetensors"]
    uploaded = upload(api, a, "pub", files, visibility="public")
    assert uploaded.status_code == 202 and uploaded.json()["version"]["status"] == "ready", uploaded.text
    for model in (BASE_MODEL, "pub"):  # the base model and a public adapter alike
        assert hit_tokens(api, worker, a, model) == 0
        assert hit_tokens(api, worker, b, model) == 0, (
            f"b hit a's cached prompt on {model}: a TTFT side channel"
        )
        assert hit_tokens(api, worker, a, model) > 0  # a's own repeat still hits
    c, d = create_tenant(api, "c", prefix_cache_namespace="team"), create_tenant(api, "d")
    set_namespace(api, d, "team")
    assert hit_tokens(api, worker, c, BASE_MODEL) == 0
    assert hit_tokens(api, worker, d, BASE_MODEL) > 0  # opted into one namespace: they share
    assert hit_tokens(api, worker, create_tenant(api, "e"), BASE_MODEL) == 0  # not in it: isolated
