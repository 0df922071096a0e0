"""Concurrent uploads through the real API app (embedded mode: inline jobs, a SQLite FILE database, and
PostgreSQL): every upload is accepted, versions are numbered 1..N per name, and nothing is orphaned."""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.engine import Engine

from api.main import create_app
from registry.db import make_engine, make_session_factory
from registry.storage import LocalBlobStore
from settings import Settings
from tests.api.conftest import ADMIN, ADMIN_KEY, TenantHandle, adapter_paths, upload
from tests.registry.upload_invariants import assert_no_orphans, assert_numbered_without_gaps

pytestmark = pytest.mark.slow  # threads racing uploads through the database

NUM_UPLOADS = 16
NUM_SAME_NAME = 8  # the other uploads each use a name of their own
WRITES = (
    "BEGIN IMMEDIATE",
    "UPDATE",
    "DELETE",
    "INSERT",
)  # statements that take SQLite's write lock (registry/db.py)


@pytest.fixture
def upload_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp directory uploads are received into (checked empty afterwards: no staging file leak)."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


@pytest.fixture
def real_client(
    fresh_db_url: str, tmp_path: Path, base_model_dir: Path, upload_tmp: Path
) -> Iterator[tuple[TestClient, Settings]]:
    """The app exactly as embedded mode builds it: its own engine on the database, really committing."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=fresh_db_url,
        admin_key=ADMIN_KEY,
        base_model_path=base_model_dir,
        is_inline_jobs=True,
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client, settings


def _new_tenant(client: TestClient, name: str) -> TenantHandle:
    tenant = client.post("/v1/admin/tenants", json={"name": name}, headers=ADMIN)
    key = client.post(f"/v1/admin/tenants/{tenant.json()['id']}/keys", headers=ADMIN)
    return TenantHandle(tenant.json()["id"], name, key.json()["id"], key.json()["key"])


def _names() -> list[str]:
    return ["shared"] * NUM_SAME_NAME + [f"solo-{i}" for i in range(NUM_UPLOADS - NUM_SAME_NAME)]


def test_concurrent_uploads_are_all_accepted_numbered_and_leave_no_orphans(
    real_client: tuple[TestClient, Settings], demo_adapter: Path, upload_tmp: Path
) -> None:
    client, settings = real_client
    tenant = _new_tenant(client, "acme")
    paths = adapter_paths(demo_adapter)
    barrier = threading.Barrier(NUM_UPLOADS)

    def one(name: str) -> tuple[int, str]:
        barrier.wait()
        response = upload(client, tenant, name, paths)
        return response.status_code, response.text

    with ThreadPoolExecutor(NUM_UPLOADS) as pool:
        results = list(pool.map(one, _names()))

    assert [status for status, _ in results] == [202] * NUM_UPLOADS, [r for r in results if r[0] != 202]
    engine = make_engine(settings.resolved_database_url())
    try:
        with make_session_factory(engine)() as session:
            expected = {"shared": NUM_SAME_NAME} | {n: 1 for n in _names() if n != "shared"}
            assert_numbered_without_gaps(session, expected)
            assert_no_orphans(session, LocalBlobStore(settings.resolved_blob_store()))
    finally:
        engine.dispose()
    assert list(upload_tmp.iterdir()) == []


@pytest.mark.parametrize("fresh_db_url", ["sqlite"], indirect=True)
def test_delete_waits_for_a_concurrent_sqlite_writer_instead_of_failing(
    real_client: tuple[TestClient, Settings], demo_adapter: Path
) -> None:
    client, settings = real_client
    tenant = _new_tenant(client, "acme")
    assert upload(client, tenant, "doomed", adapter_paths(demo_adapter)).status_code == 202
    writer = sqlite3.connect(
        settings.resolved_database_url().removeprefix("sqlite:///"), isolation_level=None
    )
    writer.execute("BEGIN IMMEDIATE")
    writer.execute(
        "INSERT INTO tenants (id, name, is_active, created_at) VALUES ('t-other', 'other', 1, '2026-01-01')"
    )
    is_writing = threading.Event()

    def on_statement(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if threading.current_thread() is not main and statement.lstrip().upper().startswith(WRITES):
            is_writing.set()

    main = threading.current_thread()
    event.listen(Engine, "before_cursor_execute", on_statement)
    try:
        with ThreadPoolExecutor(1) as pool:
            deleted = pool.submit(client.delete, "/v1/adapters/doomed", headers=tenant.headers)
            # the delete has read (auth) and now sends its first write, which needs the lock `writer` holds
            assert is_writing.wait(timeout=60)
            assert not deleted.done()
            writer.execute("COMMIT")
            response = deleted.result()
    finally:
        event.remove(Engine, "before_cursor_execute", on_statement)
    writer.close()
    assert response.status_code == 200, response.text


def _tenant_on_plan(client: TestClient, name: str, **quotas: int) -> TenantHandle:
    plan = client.post("/v1/admin/plans", json={"name": f"plan-{name}", **quotas}, headers=ADMIN)
    assert plan.status_code == 201, plan.text
    tenant = client.post(
        "/v1/admin/tenants", json={"name": name, "plan_id": plan.json()["id"]}, headers=ADMIN
    )
    key = client.post(f"/v1/admin/tenants/{tenant.json()['id']}/keys", headers=ADMIN)
    return TenantHandle(tenant.json()["id"], name, key.json()["id"], key.json()["key"])


def _upload_at_once(
    client: TestClient, tenant: TenantHandle, names: list[str], paths: list[Path]
) -> list[int]:
    barrier = threading.Barrier(len(names))

    def one(name: str) -> int:
        barrier.wait()
        return upload(client, tenant, name, paths).status_code

    with ThreadPoolExecutor(len(names)) as pool:
        return list(pool.map(one, names))


def test_concurrent_uploads_cannot_pass_the_adapter_count_quota(
    real_client: tuple[TestClient, Settings], demo_adapter: Path, upload_tmp: Path
) -> None:
    client, settings = real_client
    tenant = _tenant_on_plan(client, "counted", max_adapters=3)
    statuses = _upload_at_once(client, tenant, [f"n{i}" for i in range(8)], adapter_paths(demo_adapter))
    assert sorted(statuses) == [202] * 3 + [403] * 5, statuses
    listed = client.get("/v1/adapters", headers=tenant.headers).json()["data"]
    assert len(listed) == 3
    engine = make_engine(settings.resolved_database_url())
    try:
        with make_session_factory(engine)() as session:
            assert_no_orphans(session, LocalBlobStore(settings.resolved_blob_store()))
    finally:
        engine.dispose()
    assert list(upload_tmp.iterdir()) == []


def test_concurrent_versions_cannot_pass_the_stored_bytes_quota(
    real_client: tuple[TestClient, Settings], demo_adapter: Path
) -> None:
    client, _ = real_client
    num_bytes = (demo_adapter / "adapter_model.safetensors").stat().st_size
    tenant = _tenant_on_plan(client, "bytes", max_stored_bytes=3 * num_bytes)
    statuses = _upload_at_once(client, tenant, ["same"] * 8, adapter_paths(demo_adapter))
    assert sorted(statuses) == [202] * 3 + [413] * 5, statuses
    versions = client.get("/v1/adapters/same", headers=tenant.headers).json()["versions"]
    assert [v["number"] for v in versions] == [1, 2, 3]
