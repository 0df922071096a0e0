"""A client that leaves a NON-streamed request: the generation is aborted on the worker and billed once as
`aborted` with the tokens produced until then (the in-process worker with the tiny model; the app is driven
through ASGI so the test decides when the client disconnects)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from api.deps import get_session
from api.main import create_app
from api.services import build_services
from registry.storage import LocalBlobStore
from scheduler.core.engine_stats import EngineStats
from settings import Settings
from tests.api.asgi_support import run
from tests.api.conftest import ADMIN_KEY, TenantHandle
from tests.api.test_completions_support import BASE_MODEL, usage_rows
from tests.polling import wait_for
from tests.worker_harness import RunningWorker, worker_in_thread

MAX_TOKENS = 1000
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def worker(base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWorker]:
    blob_dir = tmp_path_factory.mktemp("disconnect-blobs")
    with worker_in_thread(base_model_dir, blob_dir) as running:
        yield running


@pytest.fixture
def api(
    worker: RunningWorker,
    base_model_dir: Path,
    tmp_path: Path,
    db_session: Session,
    db_session_factory: sessionmaker[Session],
) -> Iterator[TestClient]:
    """The API with the in-process worker published, as `lorahost serve` does."""
    settings = Settings(data_dir=tmp_path, admin_key=ADMIN_KEY, base_model_path=base_model_dir)
    services = build_services(
        settings,
        session_factory=db_session_factory,
        blob_store=LocalBlobStore(worker.settings.storage.blob_store),
    )
    services.worker_transport = worker.extra["embedded"].transport
    services.worker_directory = worker.directory
    services.internal_token = worker.internal_token
    app = create_app(settings, services=services)
    app.dependency_overrides[get_session] = lambda: db_session
    with TestClient(app) as client:
        yield client


def _engine_stats(worker: RunningWorker) -> EngineStats:
    stats: EngineStats = worker.extra["embedded"].runtime.service.engine.engine_stats()
    return stats


def _leave_once_generating(worker: RunningWorker, num_tokens: int = 10) -> Callable[[], Any]:
    """Leave as soon as the engine has produced `num_tokens` more tokens: long before the request can finish
    (a fixed linger raced a fast machine, which finished all MAX_TOKENS before the client left)."""
    produced_before = _engine_stats(worker).num_output_tokens

    async def leave() -> None:
        deadline = time.monotonic() + 30
        while True:
            stats = await anyio.to_thread.run_sync(_engine_stats, worker)
            if stats.num_running > 0 and stats.num_output_tokens - produced_before >= num_tokens:
                return
            assert time.monotonic() < deadline, "the request never started on the worker"
            await anyio.sleep(0.002)

    return leave


def test_client_leaving_a_plain_request_aborts_it_and_bills_the_tokens_produced_as_aborted(
    api: TestClient,
    worker: RunningWorker,
    new_tenant: Callable[[str], TenantHandle],
    db_session: Session,
) -> None:
    tenant = new_tenant("leaver")
    body = {"model": BASE_MODEL, "prompt": "hello world", "max_tokens": MAX_TOKENS, "ignore_eos": True}
    aborted_before = _engine_stats(worker).num_aborted
    run(
        api,
        "/v1/completions",
        tenant.headers | {"content-type": "application/json"},
        [json.dumps(body).encode()],
        leave=_leave_once_generating(worker),
    )
    [row] = usage_rows(db_session, tenant.id)
    assert row.status == "aborted", (row.status, row.error_message)
    assert 0 < row.completion_tokens < MAX_TOKENS and row.prompt_tokens > 0
    assert wait_for(lambda: _engine_stats(worker).num_running == 0), "the engine request still runs"
    assert _engine_stats(worker).num_aborted == aborted_before + 1


def test_a_client_that_stays_gets_the_whole_completion(
    api: TestClient, new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    tenant = new_tenant("stayer")
    response = api.post(
        "/v1/completions",
        json={"model": BASE_MODEL, "prompt": "hello world", "max_tokens": 5, "ignore_eos": True},
        headers=tenant.headers,
    )
    assert response.status_code == 200, response.text
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens) == ("ok", 5)


def test_a_client_leaving_releases_its_concurrent_request_slot(
    api: TestClient,
    worker: RunningWorker,
    new_tenant: Callable[[str], TenantHandle],
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    plan = api.post(
        "/v1/admin/plans", json={"name": "one-at-a-time", "max_concurrent_requests": 1}, headers=admin
    )
    tenant = new_tenant("capped-leaver")
    assert api.patch(
        f"/v1/admin/tenants/{tenant.id}", json={"plan_id": plan.json()["id"]}, headers=admin
    ).is_success
    body = {"model": BASE_MODEL, "prompt": "hello world", "max_tokens": MAX_TOKENS, "ignore_eos": True}
    run(
        api,
        "/v1/completions",
        tenant.headers | {"content-type": "application/json"},
        [json.dumps(body).encode()],
        leave=_leave_once_generating(worker),
    )
    limiter = api.app.state.services.rate_limiter  # type: ignore[attr-defined]
    assert limiter.num_held_slots(tenant.id) == 0
    short = body | {"max_tokens": 2}
    assert api.post("/v1/completions", json=short, headers=tenant.headers).status_code == 200
