"""Celery integration: a real worker process (`celery -A jobs.worker worker --pool=solo`) and Redis run the
validation job end to end (DB: a file SQLite shared with the worker; blobs: a local directory)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from jobs.celery_app import make_celery
from jobs.dispatch import CeleryJobs
from migrations.runner import upgrade
from registry import adapter_pipeline as pipeline
from registry import repository
from settings import Settings

pytestmark = pytest.mark.slow  # starts a Celery worker subprocess

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_START_TIMEOUT_S = 60
JOB_TIMEOUT_S = 60
ADMIN = {"Authorization": "Bearer celery-admin"}


def _settings_env(settings: Settings) -> dict[str, str]:
    storage, jobs = settings.storage, settings.jobs
    values = {"data_dir": settings.data_dir, "database_url": storage.database_url, "blob_store": storage.blob_store,
              "redis_url": storage.redis_url, "is_inline_jobs": jobs.is_inline_jobs,
              "celery_key_prefix": jobs.celery_key_prefix, "celery_queue": jobs.celery_queue,
              "base_model_path": settings.base_model_path, "admin_key": settings.api.admin_key}  # fmt: skip
    return {f"LORAHOST_{name.upper()}": str(value) for name, value in values.items()}


def _wait_for_ready(proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"celery worker exited with {proc.returncode}:\n{log_path.read_text()}")
        if "ready." in log_path.read_text():
            return
        time.sleep(0.2)
    pytest.fail(f"celery worker not ready after {WORKER_START_TIMEOUT_S}s:\n{log_path.read_text()}")


def _delete_redis_keys(redis_url: str, prefix: str, queue: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        for pattern in (f"{prefix}*", f"*{queue}*"):
            for key in client.scan_iter(match=pattern):
                client.delete(key)
    finally:
        client.close()


@pytest.fixture(scope="module")
def worker_settings(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, base_model_dir: Path
) -> Iterator[Settings]:
    """Settings shared by the test process and a running Celery worker subprocess."""
    work = tmp_path_factory.mktemp("celery")
    tag = uuid.uuid4().hex[:8]
    settings = Settings(
        data_dir=work,
        database_url=f"sqlite:///{work / 'jobs.db'}",
        blob_store=str(work / "blobs"),
        redis_url=redis_url,
        is_inline_jobs=False,
        celery_key_prefix=f"lorahost_test_{tag}:",
        celery_queue=f"lorahost-test-{tag}",
        base_model_path=base_model_dir,
        admin_key="celery-admin",
    )
    upgrade(settings.resolved_database_url())
    log_path = work / "worker.log"
    command = [sys.executable, "-m", "celery", "-A", "jobs.worker", "worker", "--pool=solo", "--loglevel=INFO",
               "-Q", settings.jobs.celery_queue, "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env={**os.environ, **_settings_env(settings)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for_ready(proc, log_path)
        yield settings
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _delete_redis_keys(redis_url, settings.jobs.celery_key_prefix, settings.jobs.celery_queue)


def _poll_status(ctx: pipeline.AdapterJobContext, version_id: str) -> str:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        with ctx.session_factory() as session:
            status = repository.get_version(session, version_id).status
        if status in ("ready", "failed"):
            return status
        time.sleep(0.2)
    pytest.fail(f"version {version_id} still {status} after {JOB_TIMEOUT_S}s")


def test_upload_is_validated_by_the_celery_worker(
    worker_settings: Settings, adapter_dirs: dict[str, Path]
) -> None:
    adapter_dir = next(iter(adapter_dirs.values()))
    with TestClient(create_app(worker_settings)) as client:
        tenant = client.post("/v1/admin/tenants", json={"name": "celery"}, headers=ADMIN).json()
        key = client.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json()["key"]
        headers = {"Authorization": f"Bearer {key}"}
        files = [("files", (n, (adapter_dir / n).read_bytes())) for n in pipeline.STORED_FILENAMES]
        response = client.post("/v1/adapters", data={"name": "via-celery"}, files=files, headers=headers)
        assert response.status_code == 202, response.text
        version = response.json()["version"]
        assert version["status"] == "validating"  # the worker has not run yet when the API answers
        ctx = pipeline.make_job_context(worker_settings)
        assert _poll_status(ctx, version["id"]) == "ready"
        models = client.get("/v1/models", headers=headers).json()["data"]
        assert "via-celery" in [m["id"] for m in models]
    assert all(k.startswith(f"adapters/{tenant['id']}/") for k in ctx.blob_store.list_keys())


def test_celery_worker_marks_a_tampered_upload_failed(
    worker_settings: Settings, adapter_dirs: dict[str, Path], tmp_path: Path
) -> None:
    ctx = pipeline.make_job_context(worker_settings)
    adapter_dir = next(iter(adapter_dirs.values()))
    with ctx.session_factory() as session:
        tenant = repository.create_tenant(session, "tamper")
        session.commit()
        upload_dir = tmp_path / "upload"
        upload_dir.mkdir()
        for name in pipeline.STORED_FILENAMES:
            (upload_dir / name).write_bytes((adapter_dir / name).read_bytes())
        version = pipeline.accept_upload(
            session, ctx, tenant_id=tenant.id, name="tampered", visibility=None, upload_dir=upload_dir,
            names=list(pipeline.STORED_FILENAMES),
        )  # fmt: skip
    ctx.blob_store.put_file(version.weights_blob_key, upload_dir / pipeline.CONFIG_FILENAME)
    CeleryJobs(make_celery(worker_settings), worker_settings.jobs.celery_queue).validate_adapter_version(
        version.id
    )
    assert _poll_status(ctx, version.id) == "failed"
    with ctx.session_factory() as session:
        reason = repository.get_version(session, version.id).failure_reason
    assert reason.startswith("checksum_mismatch")
    assert ctx.blob_store.list_keys(f"uploads/{version.id}/") == []
