"""`lorahost serve`'s situation: the API answers while its in-process worker is still loading the model.
A request sent then is served once the worker is ready, with no client retry, and metered once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from api.deps import get_session
from api.main import create_app
from api.services import build_services
from cluster.membership import InMemoryWorkerDirectory
from gpu_workers.worker.embedded import EmbeddedWorker
from registry.storage import LocalBlobStore
from settings import Settings
from tests.api.conftest import ADMIN_KEY, TenantHandle
from tests.api.test_completions_support import BASE_MODEL, usage_rows
from tests.worker_harness import TEST_ENGINE_SETTINGS

pytestmark = pytest.mark.slow


@pytest.fixture
def settings(tmp_path: Path, base_model_dir: Path) -> Settings:
    return Settings(
        **TEST_ENGINE_SETTINGS,
        data_dir=tmp_path,
        admin_key=ADMIN_KEY,
        base_model_path=base_model_dir,
        blob_store=str(tmp_path / "blobs"),
        internal_token="cold-start-token",
        cold_start_timeout_s=120,
    )


@pytest.fixture
def unstarted_worker(settings: Settings) -> Iterator[EmbeddedWorker]:
    worker = EmbeddedWorker(
        settings, InMemoryWorkerDirectory(), blobs=LocalBlobStore(settings.storage.blob_store)
    )
    yield worker
    worker.stop(drain=False)


@pytest.fixture
def api(
    settings: Settings,
    unstarted_worker: EmbeddedWorker,
    db_session: Session,
    db_session_factory: sessionmaker[Session],
) -> Iterator[TestClient]:
    services = build_services(
        settings, session_factory=db_session_factory, blob_store=LocalBlobStore(settings.storage.blob_store)
    )
    services.worker_transport = unstarted_worker.transport
    services.worker_directory = unstarted_worker.directory
    services.internal_token = unstarted_worker.internal_token
    app = create_app(settings, services=services)
    app.dependency_overrides[get_session] = lambda: db_session
    with TestClient(app) as client:
        yield client


def _num_waiting(api: TestClient) -> float:
    text = api.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    for family in text_string_to_metric_families(text):
        if family.name == "lorahost_cold_start_waiting_requests":
            return sum(s.value for s in family.samples)
    return 0.0


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_request_sent_while_the_worker_loads_is_served_without_retry(
    api: TestClient,
    unstarted_worker: EmbeddedWorker,
    new_tenant: Callable[[str], TenantHandle],
    db_session: Session,
) -> None:
    tenant = new_tenant("impatient")
    assert api.get("/v1/ready").status_code == 503
    result: dict[str, httpx.Response] = {}
    body = {"model": BASE_MODEL, "prompt": "hello world", "max_tokens": 4, "temperature": 0}
    sender = threading.Thread(
        target=lambda: result.update(response=api.post("/v1/completions", json=body, headers=tenant.headers))
    )
    sender.start()
    assert _wait_until(lambda: _num_waiting(api) == 1), "the request never started waiting"
    unstarted_worker.start()  # the model loads while the request waits
    sender.join(timeout=120)
    response = result["response"]
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
    assert api.get("/v1/ready").status_code == 200
    assert _num_waiting(api) == 0
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens) == ("ok", 4)
