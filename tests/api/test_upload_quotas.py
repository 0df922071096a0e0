"""Per-plan upload quotas on POST /v1/adapters (uploads and imports): uploads_per_min (429), max_adapters
(403) and max_stored_bytes (413), each refusal naming its limit; a plan without quotas keeps today's
behaviour; an archive that declares more than the limits is refused before anything is extracted."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from api.ratelimit import InMemoryRateLimiter
from api.redis_ratelimit import RedisRateLimiter
from registry.storage import LocalBlobStore
from tests.api.conftest import ADMIN, TenantHandle, adapter_paths, upload
from tests.registry.upload_builders import CONFIG, WEIGHTS, lora_config, write_raw_zip

NewTenant = Callable[[str], TenantHandle]


@pytest.fixture(autouse=True)
def frozen_window(client: TestClient) -> None:
    """One fixed rate-limit window for the whole test (a real clock can cross a minute boundary mid-test)."""
    client.app.state.services.rate_limiter = InMemoryRateLimiter(clock=lambda: 1_000_000.0)  # type: ignore[attr-defined]


def _tenant_on_plan(client: TestClient, new_tenant: NewTenant, **quotas: int | None) -> TenantHandle:
    plan = client.post(
        "/v1/admin/plans", json={"name": f"plan-{uuid.uuid4().hex[:6]}", **quotas}, headers=ADMIN
    )
    assert plan.status_code == 201, plan.text
    tenant = new_tenant(f"t-{uuid.uuid4().hex[:6]}")
    patched = client.patch(
        f"/v1/admin/tenants/{tenant.id}", json={"plan_id": plan.json()["id"]}, headers=ADMIN
    )
    assert patched.status_code == 200, patched.text
    return tenant


def _import(client: TestClient, tenant: TenantHandle, name: str):  # type: ignore[no-untyped-def]
    return client.post(
        "/v1/adapters", json={"name": name, "source": "s3://some-bucket/lora"}, headers=tenant.headers
    )


def _weights_bytes(demo_adapter: Path) -> int:
    return (demo_adapter / WEIGHTS).stat().st_size


def _error(response) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    return response.status_code, response.json()["error"]["type"], response.json()["error"]["message"]


def test_admin_plan_shows_its_upload_quotas_and_refuses_negative_ones(client: TestClient) -> None:
    quotas = {"uploads_per_min": 5, "max_adapters": 10, "max_stored_bytes": 3 * 2**40}
    created = client.post("/v1/admin/plans", json={"name": "quota", **quotas}, headers=ADMIN)
    assert created.status_code == 201, created.text
    assert {k: created.json()[k] for k in quotas} == quotas
    listed = client.get("/v1/admin/plans", headers=ADMIN).json()["data"]
    assert {k: listed[0][k] for k in quotas} == quotas
    for field in quotas:
        refused = client.post("/v1/admin/plans", json={"name": f"bad-{field}", field: -1}, headers=ADMIN)
        assert refused.status_code == 422, refused.text
    too_big = client.post("/v1/admin/plans", json={"name": "huge", "max_adapters": 2**66}, headers=ADMIN)
    assert too_big.status_code == 422, too_big.text


def test_upload_rate_over_the_plan_is_a_429_naming_uploads_per_min(
    client: TestClient, new_tenant: NewTenant, demo_adapter: Path
) -> None:
    tenant = _tenant_on_plan(client, new_tenant, uploads_per_min=2)
    other = new_tenant("other")
    paths = adapter_paths(demo_adapter)
    assert [upload(client, tenant, f"a{i}", paths).status_code for i in range(2)] == [202, 202]
    refused = upload(client, tenant, "a2", paths)
    status, type_, message = _error(refused)
    assert (status, type_) == (429, "upload_rate_limited")
    assert "2 uploads per minute (uploads_per_min)" in message and "retry in" in message
    assert int(refused.headers["Retry-After"]) >= 1
    assert _error(_import(client, tenant, "imported"))[:2] == (429, "upload_rate_limited")  # imports too
    assert upload(client, other, "a0", paths).status_code == 202  # another tenant's budget is its own
    names = [a["name"] for a in client.get("/v1/adapters", headers=tenant.headers).json()["data"]]
    assert sorted(names) == ["a0", "a1"]


def test_adapter_count_over_the_plan_is_a_403_naming_max_adapters(
    client: TestClient, new_tenant: NewTenant, demo_adapter: Path
) -> None:
    tenant = _tenant_on_plan(client, new_tenant, max_adapters=2)
    paths = adapter_paths(demo_adapter)
    assert [upload(client, tenant, name, paths).status_code for name in ("a", "b")] == [202, 202]
    status, type_, message = _error(upload(client, tenant, "c", paths))
    assert (status, type_) == (403, "adapter_quota_exceeded")
    assert "at most 2 adapters (max_adapters)" in message and "delete an adapter" in message
    assert _error(_import(client, tenant, "c"))[:2] == (403, "adapter_quota_exceeded")  # the import path
    version_2 = upload(client, tenant, "a", paths)  # a new version of an existing adapter adds no adapter
    assert version_2.status_code == 202 and version_2.json()["version"]["number"] == 2
    assert client.delete("/v1/adapters/b", headers=tenant.headers).status_code == 200
    assert upload(client, tenant, "c", paths).status_code == 202  # a deleted adapter frees its place


def test_stored_bytes_over_the_plan_is_a_413_naming_max_stored_bytes(
    client: TestClient, new_tenant: NewTenant, demo_adapter: Path, blob_store: LocalBlobStore
) -> None:
    num_bytes = _weights_bytes(demo_adapter)
    tenant = _tenant_on_plan(client, new_tenant, max_stored_bytes=2 * num_bytes)
    paths = adapter_paths(demo_adapter)
    assert [upload(client, tenant, "a", paths).status_code for _ in range(2)] == [202, 202]  # versions count
    stored_keys = blob_store.list_keys()
    status, type_, message = _error(upload(client, tenant, "b", paths))
    assert (status, type_) == (413, "storage_quota_exceeded")
    assert f"at most {2 * num_bytes} stored bytes (max_stored_bytes)" in message
    assert f"you store {2 * num_bytes} and this adapter needs {num_bytes}" in message
    assert blob_store.list_keys() == stored_keys  # nothing of the refused upload was stored
    assert client.delete("/v1/adapters/a", headers=tenant.headers).status_code == 200
    assert upload(client, tenant, "b", paths).status_code == 202  # a deleted adapter frees its bytes


def test_plan_without_quotas_keeps_todays_behaviour(
    client: TestClient, new_tenant: NewTenant, demo_adapter: Path
) -> None:
    plain = _tenant_on_plan(client, new_tenant, requests_per_min=1)  # an inference limit, no upload quota
    no_plan = new_tenant("no-plan")
    paths = adapter_paths(demo_adapter)
    for tenant in (plain, no_plan):
        statuses = [upload(client, tenant, f"a{i % 4}", paths).status_code for i in range(8)]
        assert statuses == [202] * 8
    plan = client.get("/v1/admin/plans", headers=ADMIN).json()["data"][0]
    assert (plan["uploads_per_min"], plan["max_adapters"], plan["max_stored_bytes"]) == (None, None, None)


def test_zip_declaring_weights_over_the_limit_is_refused_before_extraction(
    make_client: Callable[..., TestClient], tmp_path: Path
) -> None:
    """The weights member declares 2 MiB (limit 64 KiB) but its data is one empty deflate block: only a
    refusal on the declared size, before extraction, answers 413 (extracting it finds empty weights: 422)."""
    client = make_client(max_adapter_bytes=64 * 1024)
    tenant = client.post("/v1/admin/tenants", json={"name": "bomber"}, headers=ADMIN).json()
    key = client.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json()["key"]
    archive = tmp_path / "bomb.zip"
    config = json.dumps(lora_config()).encode()
    write_raw_zip(archive, [(CONFIG.encode(), config, 0, None), (WEIGHTS.encode(), b"\x03\x00", 8, 2 << 20)])
    response = client.post(
        "/v1/adapters",
        data={"name": "bomb"},
        files=[("files", ("bomb.zip", archive.read_bytes(), "application/zip"))],
        headers={"Authorization": f"Bearer {key}"},
    )
    status, type_, message = _error(response)
    assert (status, type_) == (413, "archive_member_too_large")
    assert f"larger than {64 * 1024} bytes" in message and "LORAHOST_MAX_ADAPTER_BYTES" in message
    scratch = client.app.state.services.settings.resolved_upload_tmp_dir()  # type: ignore[attr-defined]
    assert [p for p in scratch.rglob("*") if p.is_file()] == []


def test_zip_declaring_more_than_the_plans_stored_bytes_leave_is_refused_before_extraction(
    client: TestClient, new_tenant: NewTenant, tmp_path: Path
) -> None:
    """The platform's max_adapter_bytes (512 MiB) would let this 2 MiB member through; the plan leaves 64 KiB:
    the declared size is refused against what the plan leaves, before a byte of it is written (413)."""
    tenant = _tenant_on_plan(client, new_tenant, max_stored_bytes=64 * 1024)
    archive = tmp_path / "big.zip"
    config = json.dumps(lora_config()).encode()
    write_raw_zip(archive, [(CONFIG.encode(), config, 0, None), (WEIGHTS.encode(), b"\x03\x00", 8, 2 << 20)])
    response = client.post(
        "/v1/adapters",
        data={"name": "big"},
        files=[("files", ("big.zip", archive.read_bytes(), "application/zip"))],
        headers=tenant.headers,
    )
    status, type_, message = _error(response)
    assert (status, type_) == (413, "storage_quota_exceeded")
    assert f"{64 * 1024} bytes your plan's max_stored_bytes leaves" in message
    scratch = client.app.state.services.settings.resolved_upload_tmp_dir()  # type: ignore[attr-defined]
    assert [p for p in scratch.rglob("*") if p.is_file()] == []


def test_upload_rate_is_shared_through_redis_across_api_replicas(
    make_client: Callable[..., TestClient], new_tenant: NewTenant, demo_adapter: Path, redis_url: str
) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    replicas = [make_client(redis_url=redis_url, celery_key_prefix=prefix) for _ in range(2)]
    client = redis.Redis.from_url(redis_url)
    for replica in replicas:  # one frozen window (a real clock can cross a minute boundary mid-test)
        limiter = RedisRateLimiter(client, key_prefix=f"{prefix}rl:", clock=lambda: 1_000_000.0)
        replica.app.state.services.rate_limiter = limiter  # type: ignore[attr-defined]
    tenant = _tenant_on_plan(replicas[0], new_tenant, uploads_per_min=1)
    paths = adapter_paths(demo_adapter)
    assert upload(replicas[0], tenant, "a", paths).status_code == 202
    assert _error(upload(replicas[1], tenant, "b", paths))[:2] == (429, "upload_rate_limited")
    assert client.keys(f"{prefix}rl:{tenant.id}:uploads:*")  # its own bucket, apart from inference's
    client.delete(*client.keys(f"{prefix}*"))
