"""The upload pipeline under concurrent uploads and injected failures, on a SQLite FILE database (as
embedded mode uses) and on PostgreSQL, with really committing sessions: every upload is accepted,
versions are numbered 1..N per name, and no failure leaves a row in flight or a blob without its row."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from registry import adapter_pipeline as pipeline
from registry import repository, validation_job
from registry.db import make_engine, make_session_factory
from registry.models import AdapterVersion
from registry.storage import LocalBlobStore
from registry.validation import AdapterValidationError
from settings import Settings
from tests.registry.upload_invariants import assert_no_orphans, assert_numbered_without_gaps

NUM_UPLOADS = 16
NUM_SAME_NAME = 8


@pytest.fixture
def real_ctx(fresh_db_url: str, tmp_path: Path, base_model_dir: Path) -> Iterator[pipeline.AdapterJobContext]:
    """A job context on its own engine: sessions really commit, as in embedded mode."""
    engine = make_engine(fresh_db_url)
    settings = Settings(data_dir=tmp_path, base_model_path=base_model_dir, admin_key="x")
    yield pipeline.AdapterJobContext(
        settings=settings,
        session_factory=make_session_factory(engine),
        blob_store=LocalBlobStore(tmp_path / "blobs"),
        limits=pipeline.limits_from_settings(settings),
    )
    engine.dispose()


@pytest.fixture
def tenant_id(real_ctx: pipeline.AdapterJobContext) -> str:
    with real_ctx.session_factory() as session:
        tenant = repository.create_tenant(session, "acme")
        session.commit()
        return tenant.id


@pytest.fixture
def upload_dir(adapter_dirs: dict[str, Path], tmp_path: Path) -> Path:
    """Exactly the two adapter files of a demo adapter (read, never changed, by every upload)."""
    dest = tmp_path / "upload"
    dest.mkdir()
    for name in pipeline.STORED_FILENAMES:
        shutil.copyfile(next(iter(adapter_dirs.values())) / name, dest / name)
    return dest


def _upload_and_validate(ctx: pipeline.AdapterJobContext, tenant_id: str, name: str, upload_dir: Path) -> str:
    """What the API does for one upload in embedded mode: accept it, then run the job inline."""
    with ctx.session_factory() as session:
        version = pipeline.accept_upload(
            session, ctx, tenant_id=tenant_id, name=name, visibility=None, upload_dir=upload_dir,
            names=list(pipeline.STORED_FILENAMES),
        )  # fmt: skip
    return validation_job.run_validation_job(ctx, version.id)


def _names() -> list[str]:
    return ["shared"] * NUM_SAME_NAME + [f"solo-{i}" for i in range(NUM_UPLOADS - NUM_SAME_NAME)]


def _run_concurrently(work: Callable[[str], str], names: list[str]) -> list[str]:
    barrier = threading.Barrier(len(names))

    def one(name: str) -> str:
        barrier.wait()
        return work(name)

    with ThreadPoolExecutor(len(names)) as pool:
        return list(pool.map(one, names))


def _expected_numbers() -> dict[str, int]:
    return {"shared": NUM_SAME_NAME} | {n: 1 for n in _names() if n != "shared"}


def test_concurrent_uploads_are_numbered_1_to_n_and_leave_no_orphans(real_ctx, tenant_id, upload_dir):
    statuses = _run_concurrently(lambda n: _upload_and_validate(real_ctx, tenant_id, n, upload_dir), _names())
    assert statuses == ["ready"] * NUM_UPLOADS
    with real_ctx.session_factory() as session:
        assert_numbered_without_gaps(session, _expected_numbers())
        assert_no_orphans(session, real_ctx.blob_store)


def test_concurrent_uploads_whose_validation_fails_leave_no_orphans(
    real_ctx, tenant_id, upload_dir, monkeypatch: pytest.MonkeyPatch
):
    validate = pipeline.validate_adapter_files
    num_calls = iter(range(10_000))

    def flaky_in_job(adapter_dir: Path, ctx: pipeline.AdapterJobContext, *args):  # type: ignore[no-untyped-def]
        if "lorahost-job-" in str(adapter_dir) and next(num_calls) % 2:
            raise AdapterValidationError("injected", "injected failure in the validation job")
        return validate(adapter_dir, ctx, *args)

    monkeypatch.setattr(validation_job, "validate_adapter_files", flaky_in_job)
    statuses = _run_concurrently(lambda n: _upload_and_validate(real_ctx, tenant_id, n, upload_dir), _names())
    assert sorted(set(statuses)) == ["failed", "ready"]
    with real_ctx.session_factory() as session:
        assert_numbered_without_gaps(session, _expected_numbers())
        assert_no_orphans(session, real_ctx.blob_store)


def _fail_flush_marking_ready(session: Session, _context: object, _instances: object) -> None:
    if any(isinstance(o, AdapterVersion) and o.status == "ready" for o in session.dirty):
        raise RuntimeError("injected: disk I/O error while marking the version ready")


def test_job_that_cannot_mark_ready_fails_the_version_and_deletes_every_blob(real_ctx, tenant_id, upload_dir):
    event.listen(real_ctx.session_factory, "before_flush", _fail_flush_marking_ready)
    try:
        status = _upload_and_validate(real_ctx, tenant_id, "doomed", upload_dir)
    finally:
        event.remove(real_ctx.session_factory, "before_flush", _fail_flush_marking_ready)
    assert status == "failed"
    with real_ctx.session_factory() as session:
        version = session.query(AdapterVersion).one()
        assert version.failure_reason.startswith("internal error while validating (RuntimeError")
        assert_no_orphans(session, real_ctx.blob_store)
    assert real_ctx.blob_store.list_keys() == []
