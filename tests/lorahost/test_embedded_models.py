"""`lorahost serve` with several base models (lorahost/embedded_models.py): a catalog model's in-process worker
starts when requests wait for it, stops when idle, within the memory budget; for real, a request for the second
model is held, its worker fetches the model from the blob store and serves it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from api.main import create_app
from api.scaling_view import cold_start_waiting
from api.services import build_services
from cluster.membership import InMemoryWorkerDirectory, WorkerDirectory, WorkerRecord
from gpu_workers.worker.embedded import EmbeddedWorker
from lorahost.embedded_models import EmbeddedModelPool
from migrations.runner import upgrade
from registry.base_model_catalog import add_base_model
from registry.storage import LocalBlobStore
from scheduler.core.scheduler_stats import SchedulerStats
from settings import Settings
from tests.api.conftest import ADAPTER_FILES, ADMIN, ADMIN_KEY
from tests.api.test_completions_support import usage_rows
from tests.worker_harness import TEST_ENGINE_SETTINGS

WIDE = "wide"


class FakeWorker:
    def __init__(self, settings: Settings, directory: WorkerDirectory) -> None:
        self.settings = settings
        self.stopped = threading.Event()

    def stop(self, drain: bool = True) -> None:
        self.stopped.set()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def catalog(db_session: Session, tmp_path: Path, wide_demo_dir: Path) -> LocalBlobStore:
    store = LocalBlobStore(tmp_path / "blobs")
    add_base_model(db_session, store, WIDE, wide_demo_dir / "base")
    db_session.commit()
    return store


def test_a_waited_for_model_starts_with_its_own_settings_and_stops_when_idle(
    tmp_path: Path,
    base_model_dir: Path,
    catalog: LocalBlobStore,
    db_session_factory: sessionmaker[Session],
) -> None:
    settings = Settings(data_dir=tmp_path, base_model_path=base_model_dir, worker_embedded_idle_s=60)
    directory, waiting, clock = InMemoryWorkerDirectory(), {WIDE: 0}, Clock()
    pool = EmbeddedModelPool(
        settings, directory, db_session_factory, lambda: dict(waiting), start_worker=FakeWorker, clock=clock
    )
    assert pool.step().to_start == ()  # nothing waits: nothing starts
    waiting[WIDE] = 2
    assert pool.step().to_start == (WIDE,)
    worker = pool.workers[WIDE]
    assert isinstance(worker, FakeWorker)
    assert (
        worker.settings.base_model_name == WIDE and worker.settings.base_model_path is None
    )  # from the catalog
    assert worker.settings.worker.id == f"embedded-{WIDE}"
    assert worker.settings.resolved_host_cache_dir() == tmp_path / "workers" / WIDE / "host_cache"
    waiting[WIDE] = 0
    directory.heartbeat(_busy("embedded-wide", "http://w", WIDE, 1), ttl_s=3600)
    clock.now = 1000.0
    assert pool.step().to_stop == ()  # busy: never stopped
    directory.heartbeat(_busy("embedded-wide", "http://w", WIDE, 0), ttl_s=3600)
    pool.step()  # idle from now on
    clock.now = 1059.0
    assert pool.step().to_stop == ()
    clock.now = 1061.0
    assert pool.step().to_stop == (WIDE,)
    assert worker.stopped.wait(5) and WIDE not in pool.workers


def test_a_model_over_the_memory_budget_waits(
    tmp_path: Path, base_model_dir: Path, catalog: LocalBlobStore, db_session_factory: sessionmaker[Session]
) -> None:
    settings = Settings(data_dir=tmp_path, base_model_path=base_model_dir, worker_embedded_memory_bytes=1)
    pool = EmbeddedModelPool(
        settings, InMemoryWorkerDirectory(), db_session_factory, lambda: {WIDE: 3}, start_worker=FakeWorker
    )
    assert pool.step().to_start == () and pool.workers == {}
    refusal = pool.refusals.get(WIDE)  # it can never start: its held requests are refused at once, saying why
    assert (
        refusal is not None
        and refusal.is_final
        and "LORAHOST_WORKER_EMBEDDED_MEMORY_BYTES" in refusal.message
    )


SMALL_POOLS = {
    "engine_dtype": "float32",
    "engine_host_adapter_cache_bytes": 4 << 20,
    "engine_max_lora_rank": 8,
}
MEMINFO = "MemTotal: 1000000 kB\n"


def _busy(worker_id: str, url: str, base_model: str, num_running: int) -> WorkerRecord:
    """A live worker's record with `num_running` requests running."""
    return WorkerRecord(worker_id, url, base_model, scheduler=SchedulerStats(num_running=num_running))


def _pool(
    settings: Settings, session_factory: sessionmaker[Session], waiting: dict[str, int], **kwargs: Any
) -> EmbeddedModelPool:
    return EmbeddedModelPool(
        settings, kwargs.pop("directory", InMemoryWorkerDirectory()), session_factory, lambda: dict(waiting),
        start_worker=FakeWorker, **kwargs,
    )  # fmt: skip


def test_every_worker_counts_whole_and_a_second_model_gets_the_kv_pool_that_is_left(
    tmp_path: Path, base_model_dir: Path, catalog: LocalBlobStore, db_session_factory: sessionmaker[Session]
) -> None:
    roomy = Settings(data_dir=tmp_path, base_model_path=base_model_dir, **SMALL_POOLS)
    probe = _pool(
        roomy, db_session_factory, {}, read_memory=lambda path: MEMINFO if path == "/proc/meminfo" else None
    )
    assert probe.budget_bytes == 1000000 * 1024 // 2  # default: half the machine's memory
    pinned = probe.pinned
    assert (
        pinned is not None and pinned.kv_pool_bytes > pinned.weight_bytes
    )  # the KV pool counts, not weights only
    assert probe.step().to_start == ()
    wide_full = probe.observe()[1].num_bytes
    # room for the pinned worker and 3/4 of the wide model's configured footprint
    budget = pinned.num_bytes + wide_full * 3 // 4
    tight = roomy.updated(worker_embedded_memory_bytes=budget)
    pool = _pool(tight, db_session_factory, {WIDE: 1}, pinned=pinned)
    assert pool.step().to_start == (WIDE,)
    worker = pool.workers[WIDE]
    assert isinstance(worker, FakeWorker)
    started = pool.footprints[WIDE]
    assert started.num_bytes <= budget - pinned.num_bytes and pool.used_bytes() <= budget
    assert worker.settings.engine.host_adapter_cache_bytes == 0  # the host tier shrinks first
    full_blocks = _pool(roomy, db_session_factory, {WIDE: 1}, pinned=pinned)
    full_blocks.step()
    assert full_blocks.footprints[WIDE].num_bytes == wide_full  # with room: its configured pools
    assert (
        worker.settings.engine.num_kv_blocks
        == started.num_kv_blocks
        < full_blocks.footprints[WIDE].num_kv_blocks
    )


def test_an_idle_model_is_stopped_for_a_new_one_and_busy_ones_make_it_wait_saying_why(
    tmp_path: Path,
    base_model_dir: Path,
    catalog: LocalBlobStore,
    db_session: Session,
    db_session_factory: sessionmaker[Session],
) -> None:
    add_base_model(db_session, catalog, "other", base_model_dir)
    db_session.commit()
    roomy = Settings(data_dir=tmp_path, base_model_path=base_model_dir, **SMALL_POOLS)
    pinned, models = (
        _pool(roomy, db_session_factory, {}).pinned,
        _pool(roomy, db_session_factory, {}).observe(),
    )
    assert pinned is not None
    full = {m.name: m for m in models}
    # the pinned worker and one catalog worker fit, not two
    budget = pinned.num_bytes + max(full["other"].num_bytes, full[WIDE].num_bytes) + 1
    settings = roomy.updated(worker_embedded_memory_bytes=budget, worker_embedded_idle_s=3600)
    directory, waiting, clock = InMemoryWorkerDirectory(), {"other": 1}, Clock()
    pool = _pool(settings, db_session_factory, waiting, pinned=pinned, directory=directory, clock=clock)
    assert pool.step().to_start == ("other",)
    directory.heartbeat(_busy("embedded-other", "http://o", "other", 1), ttl_s=3600)
    waiting.update({"other": 0, WIDE: 2})
    busy = pool.step()
    assert busy.to_start == () and busy.to_stop == ()  # never stops a busy model
    refusal = pool.refusals.get(WIDE)
    assert refusal is not None and not refusal.is_final and "waits for memory" in refusal.message
    directory.heartbeat(_busy("embedded-other", "http://o", "other", 0), ttl_s=3600)
    clock.now = 10.0
    idle = pool.step()  # idle long before its timeout, but the least recently used idle model makes room
    assert (idle.to_start, idle.to_stop) == ((WIDE,), ("other",))
    assert pool.refusals.get(WIDE) is None and pool.used_bytes() <= budget


@dataclass
class Served:
    """An embedded server of its own (a file SQLite database: the pool's thread and the requests each open
    sessions, as under `lorahost serve`)."""

    client: TestClient
    pool: EmbeddedModelPool
    session_factory: sessionmaker[Session]
    blob_store: LocalBlobStore


@pytest.fixture
def served(tmp_path: Path, base_model_dir: Path) -> Iterator[Served]:
    settings = Settings(
        **TEST_ENGINE_SETTINGS,
        data_dir=tmp_path,
        admin_key=ADMIN_KEY,
        base_model_path=base_model_dir,
        blob_store=str(tmp_path / "blobs"),
        internal_token="embedded-models-token",
        cold_start_timeout_s=120,
    )
    upgrade(settings.resolved_database_url())
    directory = InMemoryWorkerDirectory()
    worker = EmbeddedWorker(settings, directory, blobs=LocalBlobStore(tmp_path / "blobs")).start()
    services = build_services(settings)
    services.worker_directory, services.worker_transport = directory, worker.transport
    services.internal_token = worker.internal_token
    pool = EmbeddedModelPool(
        settings,
        directory,
        services.session_factory,
        lambda: cold_start_waiting(services.metrics),
        poll_s=0.1,
    ).start()
    try:
        with TestClient(create_app(settings, services=services)) as client:
            yield Served(client, pool, services.session_factory, LocalBlobStore(tmp_path / "blobs"))
    finally:
        pool.close()
        worker.stop(drain=False)
        services.close()


@pytest.mark.slow
def test_a_model_added_while_serving_gets_its_own_worker_on_demand_and_its_adapters_run_there(
    served: Served, wide_demo_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    client, pool = served.client, served.pool
    tenant = client.post("/v1/admin/tenants", json={"name": "two-bases"}, headers=ADMIN).json()
    key = client.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json()["key"]
    headers = {"Authorization": f"Bearer {key}"}
    with served.session_factory() as session:  # while serving
        add_base_model(session, served.blob_store, WIDE, wide_demo_dir / "base")
        session.commit()
    wide_adapter, local_adapter = (
        min((wide_demo_dir / "adapters").iterdir()),
        next(iter(adapter_dirs.values())),
    )
    for name, adapter_dir, base in (("w", wide_adapter, WIDE), ("l", local_adapter, "lorahost-base")):
        files = [("files", (n, (adapter_dir / n).read_bytes())) for n in ADAPTER_FILES]
        accepted = client.post(
            "/v1/adapters", data={"name": name, "base_model": base}, files=files, headers=headers
        )
        assert accepted.status_code == 202 and accepted.json()["version"]["status"] == "ready", accepted.text
    assert WIDE not in pool.workers  # scaled to zero until a request waits for it
    for model in ("w", "l", WIDE):
        body = {"model": model, "prompt": "hello world", "max_tokens": 4, "ignore_eos": True}
        response = client.post("/v1/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 4
    assert WIDE in pool.workers  # started for the held request; it fetched the model from the blob store
    with served.session_factory() as session:
        rows = usage_rows(session, tenant["id"])
    served_by = {(r.model_name, r.base_model_name, r.worker_id) for r in rows}
    assert {(m, b) for m, b, _ in served_by} == {("w", WIDE), ("l", "lorahost-base"), (WIDE, WIDE)}
    assert {w for m, _, w in served_by if m in ("w", WIDE)} == {f"embedded-{WIDE}"}  # the wide model's worker
    assert {w for m, _, w in served_by if m == "l"} != {f"embedded-{WIDE}"}
