"""The upload sweeper: the pure decision (examples + a hypothesis property) and its I/O on a real DB and store."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session, sessionmaker

from registry import adapter_pipeline as pipeline
from registry import repository
from registry.models import AdapterVersion
from registry.storage import LocalBlobStore
from registry.upload_sweeper import (
    BlobEntry,
    VersionRef,
    load_version_refs,
    run_upload_sweeps,
    select_orphaned_blobs,
    sweep_orphaned_blobs,
)
from settings import Settings

pytestmark = pytest.mark.slow  # sweeps against real blob-store ages

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
MIN_AGE_S = 600.0
OLD = NOW - timedelta(hours=1)
FILES = ("adapter_config.json", "adapter_model.safetensors")


def _version(vid: str, status: str, number: int = 1, *, keys: tuple[str, ...] = ()) -> VersionRef:
    return VersionRef(vid, "t", "a", number, status, frozenset(keys))


def _blobs(*keys: str, at: datetime = OLD) -> list[BlobEntry]:
    return [BlobEntry(k, at) for k in keys]


def test_staging_blobs_without_a_row_or_of_a_finished_row_are_orphans() -> None:
    blobs = _blobs("uploads/gone/adapter_model.safetensors", "uploads/done/adapter_config.json")
    versions = [_version("done", "failed")]
    assert select_orphaned_blobs(blobs, versions, NOW, MIN_AGE_S) == sorted(b.key for b in blobs)


def test_staging_blobs_of_an_in_flight_version_are_kept() -> None:
    blobs = _blobs("uploads/v1/adapter_model.safetensors", "uploads/v2/adapter_config.json")
    versions = [_version("v1", "validating"), _version("v2", "uploading", 2)]
    assert select_orphaned_blobs(blobs, versions, NOW, MIN_AGE_S) == []


def test_final_blobs_no_row_references_are_orphans_unless_a_job_is_moving_files_there() -> None:
    referenced = "adapters/t/a/1/adapter_model.safetensors"
    moving = "adapters/t/a/2/adapter_model.safetensors"  # v2 validating: its job copies here before commit
    orphan = "adapters/t/a/3/adapter_model.safetensors"  # v3 failed (or rolled back) after the copy
    versions = [_version("v1", "ready", 1, keys=(referenced,)), _version("v2", "validating", 2),
                _version("v3", "failed", 3)]  # fmt: skip
    assert select_orphaned_blobs(_blobs(referenced, moving, orphan), versions, NOW, MIN_AGE_S) == [orphan]


def test_young_blobs_and_keys_outside_the_upload_prefixes_are_never_deleted() -> None:
    young = _blobs("uploads/gone/adapter_model.safetensors", at=NOW - timedelta(seconds=MIN_AGE_S - 1))
    foreign = _blobs("other-app/data.bin", "uploadsX/v/f", "adapters-old/x")
    assert select_orphaned_blobs(young + foreign, [], NOW, MIN_AGE_S) == []


def test_a_referenced_blob_is_kept_even_under_a_staging_key() -> None:
    key = "uploads/v1/adapter_config.json"
    assert select_orphaned_blobs(_blobs(key), [_version("v1", "ready", keys=(key,))], NOW, MIN_AGE_S) == []


# ---- property: never a referenced blob, never a young one, never an in-flight version's files ----------------

_ids = st.sampled_from(["v1", "v2", "v3", "v4"])
_statuses = st.sampled_from(["uploading", "validating", "ready", "failed"])


@st.composite
def _version_refs(draw: st.DrawFn) -> list[VersionRef]:
    refs = []
    for number, vid in enumerate(draw(st.lists(_ids, unique=True)), start=1):
        status = draw(_statuses)
        if status == "ready":
            keys = tuple(f"adapters/t/a/{number}/{f}" for f in FILES)
        elif status == "failed":
            keys = ()
        else:
            keys = tuple(f"uploads/{vid}/{f}" for f in FILES)
        refs.append(VersionRef(vid, "t", "a", number, status, frozenset(draw(st.sets(st.sampled_from(keys))))
                               if keys else frozenset()))  # fmt: skip
    return refs


_keys = st.one_of(
    st.builds(lambda v, f: f"uploads/{v}/{f}", _ids, st.sampled_from(FILES)),
    st.builds(lambda n, f: f"adapters/t/a/{n}/{f}", st.integers(1, 5), st.sampled_from(FILES)),
    st.sampled_from(["other/x", "uploads", "adapters/t/a/1"]),
)
_blob_entries = st.lists(
    st.builds(BlobEntry, _keys, st.integers(-7200, 7200).map(lambda s: NOW - timedelta(seconds=s))),
    unique_by=lambda b: b.key,
)


@settings(max_examples=300, deadline=None)
@given(blobs=_blob_entries, versions=_version_refs(), min_age_s=st.floats(0, 3600))
def test_never_deletes_a_live_or_young_blob(
    blobs: list[BlobEntry], versions: list[VersionRef], min_age_s: float
) -> None:
    deleted = set(select_orphaned_blobs(blobs, versions, NOW, min_age_s))
    assert deleted <= {b.key for b in blobs}
    by_key = {b.key: b for b in blobs}
    for key in deleted:
        assert NOW - by_key[key].modified_at >= timedelta(seconds=min_age_s)  # old enough
        assert all(key not in v.blob_keys for v in versions)  # no row references it
        assert key.startswith(("uploads/", "adapters/"))
        for v in versions:
            if v.is_in_flight:  # an in-flight version's staging files and its job's target stay
                assert not key.startswith((f"uploads/{v.id}/", f"adapters/t/a/{v.number}/"))
    for blob in blobs:  # and everything else old, unreferenced and not in flight goes
        is_candidate = blob.key not in deleted and NOW - blob.modified_at > timedelta(seconds=min_age_s)
        if is_candidate and blob.key.count("/") == 2 and blob.key.startswith("uploads/"):
            vid = blob.key.split("/")[1]
            assert any(v.id == vid and (v.is_in_flight or blob.key in v.blob_keys) for v in versions)


# ---- I/O: a real DB (SQLite + PostgreSQL) and a local store -------------------------------------------------


@pytest.fixture
def ctx(
    tmp_path: Path, base_model_dir: Path, db_session_factory: sessionmaker[Session]
) -> pipeline.AdapterJobContext:
    settings = Settings(data_dir=tmp_path, base_model_path=base_model_dir, admin_key="x",
                        stale_version_age_s=60, orphan_blob_min_age_s=60)  # fmt: skip
    return pipeline.AdapterJobContext(
        settings=settings,
        session_factory=db_session_factory,
        blob_store=LocalBlobStore(tmp_path / "blobs"),
        limits=pipeline.limits_from_settings(settings),
    )


def _stage(
    session: Session, ctx: pipeline.AdapterJobContext, adapter_dirs: dict[str, Path], tmp: Path
) -> str:
    src = next(iter(adapter_dirs.values()))
    upload = tmp / "upload"
    upload.mkdir(exist_ok=True)
    for name in FILES:
        shutil.copyfile(src / name, upload / name)
    tenant = repository.create_tenant(session, f"sweep-{os.urandom(3).hex()}")
    session.commit()
    version = pipeline.accept_upload(session, ctx, tenant_id=tenant.id, name="lora", visibility=None,
                                     upload_dir=upload, names=list(FILES))  # fmt: skip
    return version.id


def _age(store: LocalBlobStore, seconds: float) -> None:
    moment = (datetime.now(UTC) - timedelta(seconds=seconds)).timestamp()
    for key in store.list_keys():
        os.utime(store.root / key, (moment, moment))


def test_sweep_deletes_old_orphans_and_keeps_an_in_flight_versions_blobs(
    db_session: Session, ctx: pipeline.AdapterJobContext, adapter_dirs: dict[str, Path], tmp_path: Path
) -> None:
    version_id = _stage(db_session, ctx, adapter_dirs, tmp_path)  # validating, staging blobs
    store = ctx.blob_store
    assert isinstance(store, LocalBlobStore)
    in_flight = store.list_keys()
    store.put_file("uploads/no-row/adapter_config.json", tmp_path / "upload" / FILES[0])  # died before commit
    _age(store, 3600)
    store.put_file("uploads/young/adapter_config.json", tmp_path / "upload" / FILES[0])  # being written now
    assert sweep_orphaned_blobs(ctx.session_factory, store, 60) == ["uploads/no-row/adapter_config.json"]
    assert store.list_keys() == sorted([*in_flight, "uploads/young/adapter_config.json"])
    assert {v.id for v in load_version_refs(db_session)} >= {version_id}


def test_run_upload_sweeps_fails_a_stale_version_then_removes_every_blob_it_left(
    db_session: Session, ctx: pipeline.AdapterJobContext, adapter_dirs: dict[str, Path], tmp_path: Path
) -> None:
    version_id = _stage(db_session, ctx, adapter_dirs, tmp_path)
    row = db_session.get(AdapterVersion, version_id)
    row.created_at = datetime.now(UTC) - timedelta(hours=1)
    db_session.commit()
    store = ctx.blob_store
    stray = (
        f"adapters/{row.adapter.tenant_id}/{row.adapter_id}/1/adapter_config.json"  # job copied, then died
    )
    store.put_file(stray, tmp_path / "upload" / FILES[0])
    _age(store, 3600)  # type: ignore[arg-type]
    result = run_upload_sweeps(ctx)
    assert list(result.failed_version_ids) == [version_id]
    assert list(result.deleted_blob_keys) == [stray]  # the staging blobs went with the failed version
    assert store.list_keys() == []
    db_session.expire_all()
    assert repository.get_version(db_session, version_id).status == "failed"


def test_run_upload_sweeps_removes_job_scratch_dirs_left_by_killed_processes(
    ctx: pipeline.AdapterJobContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    left = scratch / "lorahost-job-abc123"  # a job's directory whose process was killed (no lock held)
    (left / "adapter").mkdir(parents=True)
    old = time.time() - 3600
    os.utime(left, (old, old))
    result = run_upload_sweeps(ctx)
    assert list(result.removed_job_dirs) == [left] and list(scratch.iterdir()) == []
