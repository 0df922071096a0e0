"""PostgreSQL unavailable under a running API (a fault proxy in front of it resets every connection and refuses
new ones, as a restart or failover does): writes and uncached lookups answer 503 with Retry-After; inference for
a key and adapter the API knows keeps serving from its caches past their TTL; the usage of what was served is
spooled and written once the database is back, one row per request with the tokens the client received; the API
answers normally again at once after the outage."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import make_url, select

from api.caches import key_digest
from api.main import create_app
from api.services import Services, build_services
from benchmarks.fault_proxy import FaultProxy
from cluster.membership import InMemoryWorkerDirectory
from gpu_workers.worker.embedded import EmbeddedWorker
from registry.db import make_engine, make_session_factory
from registry.models import UsageRecord
from registry.storage import LocalBlobStore
from settings import Settings
from tests.api.conftest import ADMIN, ADMIN_KEY, TenantHandle, adapter_paths, create_tenant, upload
from tests.polling import wait_for
from tests.registry.db_fixtures import migrated_postgres_database
from tests.worker_harness import TEST_ENGINE_SETTINGS

pytestmark = pytest.mark.slow  # PostgreSQL behind a fault proxy, an embedded worker on the tiny model

TTL_S = 0.3  # the caches' TTL: the outage outlasts it


@dataclass
class Stack:
    client: TestClient
    services: Services
    proxy: FaultProxy


@pytest.fixture
def stack(tmp_path: Path, base_model_dir: Path) -> Iterator[Stack]:
    with migrated_postgres_database() as url:
        target = make_url(url)
        proxy = FaultProxy(target.host or "127.0.0.1", target.port or 5432)
        proxied = target.set(port=proxy.port).render_as_string(hide_password=False)
        settings = Settings(
            **TEST_ENGINE_SETTINGS, data_dir=tmp_path, admin_key=ADMIN_KEY, base_model_path=base_model_dir,
            database_url=proxied, blob_store=str(tmp_path / "blobs"), internal_token="outage-token",
            cold_start_timeout_s=120, placement_interval_s=0.0, usage_sweep_interval_s=0.0,
            upload_sweep_interval_s=0.0, predictor_training_interval_s=0.0, auth_cache_ttl_s=TTL_S,
            model_cache_ttl_s=TTL_S, usage_checkpoint_interval_s=0.2, usage_lease_timeout_s=30.0,
        )  # fmt: skip
        blobs = LocalBlobStore(tmp_path / "blobs")
        worker = EmbeddedWorker(settings, InMemoryWorkerDirectory(), blobs=blobs).start()
        engine = make_engine(proxied)
        try:
            assert wait_for(lambda: worker.runtime.service is not None, timeout_s=120), (
                "the worker never loaded"
            )
            services = build_services(
                settings, session_factory=make_session_factory(engine), blob_store=blobs
            )
            services.worker_transport = worker.transport
            services.worker_directory = worker.directory
            services.internal_token = worker.internal_token
            with TestClient(create_app(settings, services=services)) as client:
                yield Stack(client, services, proxy)
        finally:
            worker.stop(drain=False)
            proxy.close()
            engine.dispose()


def _complete(stack: Stack, tenant: TenantHandle, model: str, is_stream: bool) -> tuple[int, int]:
    """(status, completion tokens the client received) of one completion."""
    body = {"model": model, "prompt": "hello there", "max_tokens": 5, "temperature": 0, "stream": is_stream}
    if is_stream:
        body["stream_options"] = {"include_usage": True}
    response = stack.client.post("/v1/completions", json=body, headers=tenant.headers)
    if response.status_code != 200:
        return response.status_code, 0
    if not is_stream:
        return 200, response.json()["usage"]["completion_tokens"]
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert not [c for c in chunks if "error" in c], chunks
    return 200, chunks[-1]["usage"]["completion_tokens"]


def _usage(stack: Stack, tenant_id: str) -> list[tuple[str, int]]:
    with stack.services.session_factory() as session:
        query = select(UsageRecord.status, UsageRecord.completion_tokens).where(
            UsageRecord.tenant_id == tenant_id
        )
        return sorted(tuple(row) for row in session.execute(query))  # type: ignore[misc]


def test_an_outage_refuses_writes_with_503_serves_known_tenants_and_bills_them_after(
    stack: Stack, demo_adapter: Path
) -> None:
    tenant = create_tenant(stack.client, "outage")
    assert upload(stack.client, tenant, "steady", adapter_paths(demo_adapter)).status_code in (201, 202)
    assert wait_for(
        lambda: (
            stack.client.get("/v1/adapters/steady", headers=tenant.headers).json().get("latest_ready_version")
        )
    )
    warm = [_complete(stack, tenant, "steady", is_stream) for is_stream in (False, True)]
    assert [status for status, _ in warm] == [200, 200]

    stack.proxy.cut()
    digest = key_digest(tenant.key)
    assert wait_for(lambda: stack.services.auth_cache.get(digest) is None, timeout_s=10)  # past the TTL
    served = [_complete(stack, tenant, "steady", is_stream) for is_stream in (False, True, True, False)]
    assert [status for status, _ in served] == [200] * 4
    for response in (
        stack.client.post("/v1/admin/tenants", json={"name": "during"}, headers=ADMIN),
        stack.client.get("/v1/adapters", headers=tenant.headers),
        stack.client.post(
            "/v1/completions",
            json={"model": "steady", "prompt": "x"},
            headers={"Authorization": f"Bearer lh_{uuid.uuid4()}_{'x' * 43}"},
        ),
    ):
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == "5"
        assert response.json()["error"]["type"] == "database_unavailable"
    assert _complete(stack, tenant, "never-seen", False)[0] == 503  # an adapter it does not know: no guess
    # the readiness probe keeps the replica in rotation; the health check says the database is gone
    assert stack.client.get("/v1/live").status_code == 200
    assert stack.client.get("/v1/health").status_code == 503

    stack.proxy.restore()
    assert stack.client.post("/v1/admin/tenants", json={"name": "after"}, headers=ADMIN).status_code == 201
    # one row per request: the refused one an `error` with nothing billed (a platform failure for the SLO)
    expected = sorted([("error", 0), *(("ok", tokens) for _, tokens in [*warm, *served])])
    assert wait_for(lambda: _usage(stack, tenant.id) == expected, timeout_s=30), _usage(stack, tenant.id)
    spool = stack.services.usage_ledger.writer.spool
    assert spool is not None and not spool.has_pending()
