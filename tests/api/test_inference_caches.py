"""The inference hot path's in-process caches (api/caches.py): what is cached, for how long, what drops it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.caches import TtlCache
from registry import api_keys
from tests.api.conftest import ADMIN, TenantHandle
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, add_ready_version


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def workers(client: TestClient) -> ScriptedWorkers:
    scripted = ScriptedWorkers()
    scripted.install(client)
    scripted.add("w1")
    return scripted


def _complete(client: TestClient, tenant: TenantHandle, model: str = BASE_MODEL) -> int:
    body = {"model": model, "prompt": "hi", "max_tokens": 3}
    return client.post("/v1/completions", json=body, headers=tenant.headers).status_code


def _fake_clock_cache(client: TestClient, name: str, ttl_s: float) -> FakeClock:
    clock = FakeClock()
    setattr(client.app.state.services, name, TtlCache(ttl_s, clock=clock))  # type: ignore[attr-defined]
    return clock


def test_ttl_cache_expires_entries_and_bounds_its_size() -> None:
    clock = FakeClock()
    cache: TtlCache[str, int] = TtlCache(5.0, max_entries=2, clock=clock)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, 2, 3)
    clock.now += 5.0
    assert cache.get("b") is None
    disabled: TtlCache[str, int] = TtlCache(0.0)
    disabled.put("a", 1)
    assert disabled.get("a") is None


def test_a_verified_key_is_not_read_from_the_db_again_within_the_ttl(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = api_keys.find_api_key
    monkeypatch.setattr(api_keys, "find_api_key", lambda s, k: calls.append(k) or real(s, k))
    clock = _fake_clock_cache(client, "auth_cache", 5.0)
    assert [_complete(client, tenant) for _ in range(3)] == [200, 200, 200]
    assert len(calls) == 1
    clock.now += 5.0
    assert _complete(client, tenant) == 200 and len(calls) == 2


def test_revoked_key_and_disabled_tenant_are_refused_at_once_by_this_process(
    client: TestClient, workers: ScriptedWorkers, new_tenant, db_session: Session
) -> None:
    revoked, disabled = new_tenant("revoked"), new_tenant("disabled")
    assert (_complete(client, revoked), _complete(client, disabled)) == (200, 200)
    assert client.delete(f"/v1/admin/keys/{revoked.key_id}", headers=ADMIN).status_code == 200
    patch = client.patch(f"/v1/admin/tenants/{disabled.id}", json={"is_active": False}, headers=ADMIN)
    assert patch.status_code == 200
    assert (_complete(client, revoked), _complete(client, disabled)) == (401, 403)


def test_new_ready_version_is_served_once_the_model_cache_entry_expires(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    clock = _fake_clock_cache(client, "model_cache", 2.0)
    v1 = add_ready_version(db_session, tenant.id, "tuned")
    assert _complete(client, tenant, "tuned") == 200
    v2 = add_ready_version(db_session, tenant.id, "tuned")
    assert _complete(client, tenant, "tuned") == 200
    clock.now += 2.0
    assert _complete(client, tenant, "tuned") == 200
    sent = [r.adapter.adapter_key for r in workers.workers["w1.workers.test"].requests]
    assert sent == [v1.id, v1.id, v2.id]


def test_deleted_adapter_is_refused_at_once_and_unknown_names_are_not_cached(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    _fake_clock_cache(client, "model_cache", 3600.0)
    assert _complete(client, tenant, "later") == 404
    add_ready_version(db_session, tenant.id, "later")
    assert _complete(client, tenant, "later") == 200
    assert client.delete("/v1/adapters/later", headers=tenant.headers).status_code == 200
    assert _complete(client, tenant, "later") == 404


def test_disabled_tenants_public_adapters_are_hidden_from_others_at_once(
    client: TestClient, workers: ScriptedWorkers, new_tenant, db_session: Session
) -> None:
    _fake_clock_cache(client, "model_cache", 3600.0)
    owner, other = new_tenant("owner"), new_tenant("other")
    add_ready_version(db_session, owner.id, "shared", visibility="public")

    def listed() -> list[str]:
        return [m["id"] for m in client.get("/v1/models", headers=other.headers).json()["data"]]

    assert _complete(client, other, "shared") == 200 and "shared" in listed()  # now cached for `other`
    disable = client.patch(f"/v1/admin/tenants/{owner.id}", json={"is_active": False}, headers=ADMIN)
    assert disable.status_code == 200
    assert _complete(client, other, "shared") == 404 and "shared" not in listed()
    assert client.get("/v1/models/shared", headers=other.headers).status_code == 404
    enable = client.patch(f"/v1/admin/tenants/{owner.id}", json={"is_active": True}, headers=ADMIN)
    assert enable.status_code == 200
    assert _complete(client, other, "shared") == 200 and "shared" in listed()
