"""API fixtures: create_app(test settings) with the rolled-back test session and a local blob store, and
(`embedded`) the same app in front of an embedded worker running the tiny model.

The request session is the test's `db_session` (dependency override); inline jobs get sessions on the same
connection, so everything a test does through HTTP is rolled back too.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from api.deps import get_session
from api.main import create_app
from api.prompting import BaseModelTokenizer
from api.services import build_services
from api.serving_heap import ServingHeap
from cluster.membership import InMemoryWorkerDirectory
from gpu_workers.worker.embedded import EmbeddedWorker
from registry.storage import LocalBlobStore
from settings import Settings
from tests.api.test_completions_support import ScriptedWorkers
from tests.polling import wait_for
from tests.registry.db_fixtures import *
from tests.worker_harness import TEST_ENGINE_SETTINGS

ADMIN_KEY = "test-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass
class TenantHandle:
    """A tenant created through the admin API, with its key."""

    id: str
    name: str
    key_id: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture
def blob_store(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs")


@pytest.fixture
def make_client(
    tmp_path: Path,
    base_model_dir: Path,
    db_session: Session,
    db_session_factory: sessionmaker[Session],
    blob_store: LocalBlobStore,
) -> Iterator[Callable[..., TestClient]]:
    """Build a TestClient for explicit settings (keyword overrides on top of the test defaults); `serving_heap`
    (a ServingHeap) is set on the app as api/http_server.py does for a served process."""
    clients: list[TestClient] = []

    def make(serving_heap: ServingHeap | None = None, **overrides: Any) -> TestClient:
        values = {
            "data_dir": tmp_path,
            "admin_key": ADMIN_KEY,
            "base_model_path": base_model_dir,
            "cold_start_timeout_s": 0.0,  # no worker = an immediate 503 (tests of the wait set their own)
            # no inline placement timer: its thread would share the test's DB connection (tests call
            # api.main.place themselves)
            "placement_interval_s": 0.0,
        } | overrides
        settings = Settings(**values)
        services = build_services(settings, session_factory=db_session_factory, blob_store=blob_store)
        app = create_app(settings, services=services)
        if serving_heap is not None:
            app.state.serving_heap = serving_heap
        app.dependency_overrides[get_session] = lambda: db_session
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


@pytest.fixture
def embedded(
    tmp_path: Path, base_model_dir: Path, db_session: Session, db_session_factory: sessionmaker[Session]
) -> Iterator[tuple[TestClient, EmbeddedWorker]]:
    """(client, worker): the app with an embedded worker on the tiny model as its only worker, started and
    loaded; the worker stops (without draining) after the test."""
    settings = Settings(
        **TEST_ENGINE_SETTINGS,
        data_dir=tmp_path,
        admin_key=ADMIN_KEY,
        base_model_path=base_model_dir,
        blob_store=str(tmp_path / "blobs"),
        internal_token="embedded-worker-token",
        cold_start_timeout_s=120,
        placement_interval_s=0.0,
    )
    blobs = LocalBlobStore(tmp_path / "blobs")
    worker = EmbeddedWorker(settings, InMemoryWorkerDirectory(), blobs=blobs).start()
    assert wait_for(lambda: worker.runtime.service is not None, timeout_s=120), "the worker never loaded"
    services = build_services(settings, session_factory=db_session_factory, blob_store=blobs)
    services.worker_transport = worker.transport
    services.worker_directory = worker.directory
    services.internal_token = worker.internal_token
    app = create_app(settings, services=services)
    app.dependency_overrides[get_session] = lambda: db_session
    try:
        with TestClient(app) as api:
            yield api, worker
    finally:
        worker.stop(drain=False)


def create_tenant(client: TestClient, name: str, **fields: str) -> TenantHandle:
    """Create a tenant (with admin `fields` such as prefix_cache_namespace) and a key through the admin API."""
    tenant = client.post("/v1/admin/tenants", json={"name": name, **fields}, headers=ADMIN)
    assert tenant.status_code == 201, tenant.text
    key = client.post(f"/v1/admin/tenants/{tenant.json()['id']}/keys", headers=ADMIN)
    assert key.status_code == 201, key.text
    return TenantHandle(tenant.json()["id"], name, key.json()["id"], key.json()["key"])


@pytest.fixture
def new_tenant(client: TestClient) -> Callable[[str], TenantHandle]:
    """Create a tenant and a key through the admin API."""

    def create(name: str = "acme") -> TenantHandle:
        return create_tenant(client, name)

    return create


@pytest.fixture
def tenant(new_tenant: Callable[[str], TenantHandle]) -> TenantHandle:
    return new_tenant("acme")


@pytest.fixture
def demo_adapter(adapter_dirs: dict[str, Path]) -> Path:
    """The first demo adapter's directory (adapter_config.json + adapter_model.safetensors + README.md)."""
    return next(iter(adapter_dirs.values()))


def multipart_files(paths: list[Path]) -> list[tuple[str, tuple[str, bytes, str]]]:
    """`files` parts for TestClient, one per path."""
    return [("files", (p.name, p.read_bytes(), "application/octet-stream")) for p in paths]


def upload(client: TestClient, tenant: TenantHandle, name: str, paths: list[Path], **fields: str):  # type: ignore[no-untyped-def]
    """POST /v1/adapters as multipart."""
    return client.post(
        "/v1/adapters", data={"name": name, **fields}, files=multipart_files(paths), headers=tenant.headers
    )


def adapter_paths(adapter_dir: Path) -> list[Path]:
    return [adapter_dir / name for name in ADAPTER_FILES]


def copy_adapter(adapter_dir: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ADAPTER_FILES:
        shutil.copyfile(adapter_dir / name, dest / name)
    return dest


def num_timer_threads(job_name: str) -> int:
    """How many inline-job timers (jobs.usage_sweep.PeriodicJob threads) named `job_name` are running. The app's
    lifespan starts its timers before a TestClient's __enter__ returns, so a count taken right after
    make_client is final for that client: no waiting for a timer that might still start."""
    return sum(t.name == f"lorahost-{job_name}" and t.is_alive() for t in threading.enumerate())


@pytest.fixture
def workers(client: TestClient) -> ScriptedWorkers:
    """Scripted workers the client's API routes to (none until a test adds one)."""
    scripted = ScriptedWorkers()
    scripted.install(client)
    return scripted


@pytest.fixture
def tokenizer(base_model_dir: Path) -> BaseModelTokenizer:
    """The tiny demo base model's tokenizer, as the API loads it."""
    return BaseModelTokenizer.load(base_model_dir)
