"""The upload pipeline's plain functions: staging, the validation job, s3:// imports (SQLite + PostgreSQL)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from registry import adapter_import, repository, validation_job
from registry import adapter_pipeline as pipeline
from registry.digests import sha256_file
from registry.errors import InvalidRequestError
from registry.import_sources import S3Credentials, SourceUnreadableError
from registry.models import Adapter, AdapterVersion
from registry.s3_storage import S3BlobStore
from registry.storage import LocalBlobStore
from registry.validation import AdapterValidationError
from settings import Settings


def _adapter_dir(adapter_dirs: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of a demo adapter without its README (exactly the two adapter files)."""
    src = next(iter(adapter_dirs.values()))
    dest = tmp_path / "adapter"
    dest.mkdir()
    for name in pipeline.STORED_FILENAMES:
        shutil.copyfile(src / name, dest / name)
    return dest


@pytest.fixture
def ctx(
    tmp_path: Path, base_model_dir: Path, db_session_factory: sessionmaker[Session]
) -> pipeline.AdapterJobContext:
    settings = Settings(data_dir=tmp_path, base_model_path=base_model_dir, admin_key="x")
    return pipeline.AdapterJobContext(
        settings=settings,
        session_factory=db_session_factory,
        blob_store=LocalBlobStore(tmp_path / "blobs"),
        limits=pipeline.limits_from_settings(settings),
    )


@pytest.fixture
def tenant_id(db_session: Session) -> str:
    tenant = repository.create_tenant(db_session, "acme")
    db_session.commit()
    return tenant.id


def _stage(
    db_session: Session, ctx, tenant_id: str, adapter_dir: Path, name: str = "my-lora"
) -> AdapterVersion:
    info, base = pipeline.validate_adapter_files(adapter_dir, ctx)
    return pipeline.stage_upload(
        db_session,
        ctx,
        tenant_id=tenant_id,
        name=name,
        visibility=None,
        adapter_dir=adapter_dir,
        info=info,
        base_model_name=base.name,
    )


def test_staged_upload_is_validating_under_temporary_keys(db_session, ctx, tenant_id, adapter_dirs, tmp_path):
    version = _stage(db_session, ctx, tenant_id, _adapter_dir(adapter_dirs, tmp_path))
    assert version.status == "validating" and version.number == 1
    assert ctx.blob_store.list_keys() == sorted(pipeline.staging_keys(version.id).values())


def test_job_marks_ready_and_moves_blobs_to_final_keys(db_session, ctx, tenant_id, adapter_dirs, tmp_path):
    adapter_dir = _adapter_dir(adapter_dirs, tmp_path)
    version = _stage(db_session, ctx, tenant_id, adapter_dir)
    assert validation_job.run_validation_job(ctx, version.id) == "ready"
    db_session.expire_all()
    version = repository.get_version(db_session, version.id)
    final = pipeline.final_keys(tenant_id, version.adapter_id, 1)
    assert version.status == "ready" and version.failure_reason is None
    assert (version.config_blob_key, version.weights_blob_key) == tuple(final.values())
    assert ctx.blob_store.list_keys() == sorted(final.values())
    assert version.sha256 == sha256_file(adapter_dir / pipeline.WEIGHTS_FILENAME)
    assert version.config_sha256 == sha256_file(adapter_dir / pipeline.CONFIG_FILENAME)
    assert version.rank and version.target_modules and version.finished_at is not None


def test_job_fails_on_checksum_mismatch_and_deletes_blobs(db_session, ctx, tenant_id, adapter_dirs, tmp_path):
    version = _stage(db_session, ctx, tenant_id, _adapter_dir(adapter_dirs, tmp_path))
    ctx.blob_store.put_stream(version.weights_blob_key, io.BytesIO(b"tampered"))
    assert validation_job.run_validation_job(ctx, version.id) == "failed"
    db_session.expire_all()
    version = repository.get_version(db_session, version.id)
    assert version.status == "failed" and version.failure_reason.startswith("checksum_mismatch")
    assert ctx.blob_store.list_keys() == []
    assert repository.list_ready_models(db_session, tenant_id) == []


def test_job_fails_when_the_staged_config_was_swapped(db_session, ctx, tenant_id, adapter_dirs, tmp_path):
    adapter_dir = _adapter_dir(adapter_dirs, tmp_path)
    version = _stage(db_session, ctx, tenant_id, adapter_dir)
    config = json.loads((adapter_dir / pipeline.CONFIG_FILENAME).read_text())
    swapped = {**config, "lora_alpha": config["lora_alpha"] * 2}  # still a valid config, another scale
    ctx.blob_store.put_stream(version.config_blob_key, io.BytesIO(json.dumps(swapped).encode()))
    assert validation_job.run_validation_job(ctx, version.id) == "failed"
    db_session.expire_all()
    version = repository.get_version(db_session, version.id)
    assert version.failure_reason.startswith("checksum_mismatch")
    assert pipeline.CONFIG_FILENAME in version.failure_reason
    assert ctx.blob_store.list_keys() == []


def test_job_is_idempotent_for_finished_versions(db_session, ctx, tenant_id, adapter_dirs, tmp_path):
    version = _stage(db_session, ctx, tenant_id, _adapter_dir(adapter_dirs, tmp_path))
    validation_job.run_validation_job(ctx, version.id)
    keys = ctx.blob_store.list_keys()
    assert validation_job.run_validation_job(ctx, version.id) == "ready"
    assert ctx.blob_store.list_keys() == keys


def test_staging_failure_leaves_no_blob_and_no_row(db_session, ctx, tenant_id, adapter_dirs, tmp_path):
    adapter_dir = _adapter_dir(adapter_dirs, tmp_path)
    info, base = pipeline.validate_adapter_files(adapter_dir, ctx)
    with pytest.raises(InvalidRequestError):
        pipeline.stage_upload(
            db_session,
            ctx,
            tenant_id=tenant_id,
            name="Bad Name",
            visibility=None,
            adapter_dir=adapter_dir,
            info=info,
            base_model_name=base.name,
        )
    assert ctx.blob_store.list_keys() == []
    assert repository.count_rows(db_session, AdapterVersion) == 0
    assert repository.count_rows(db_session, Adapter) == 0


def test_reupload_creates_the_next_version(db_session, ctx, tenant_id, adapter_dirs, tmp_path):
    adapter_dir = _adapter_dir(adapter_dirs, tmp_path)
    first = _stage(db_session, ctx, tenant_id, adapter_dir)
    second = _stage(db_session, ctx, tenant_id, adapter_dir)
    assert (first.number, second.number) == (1, 2) and first.adapter_id == second.adapter_id


def test_accept_upload_refuses_invalid_adapter_before_storing(
    db_session, ctx, tenant_id, adapter_dirs, tmp_path
):
    adapter_dir = _adapter_dir(adapter_dirs, tmp_path)
    (adapter_dir / pipeline.WEIGHTS_FILENAME).write_bytes(b"")
    with pytest.raises(AdapterValidationError) as err:
        pipeline.accept_upload(
            db_session, ctx, tenant_id=tenant_id, name="x", visibility=None, upload_dir=adapter_dir,
            names=list(pipeline.STORED_FILENAMES),
        )  # fmt: skip
    assert err.value.code == "empty_weights"
    assert ctx.blob_store.list_keys() == [] and repository.count_rows(db_session, AdapterVersion) == 0


def test_no_base_model_at_all_is_a_clear_error(tmp_path, db_session_factory, adapter_dirs):
    settings = Settings(data_dir=tmp_path)
    ctx = pipeline.AdapterJobContext(
        settings, db_session_factory, LocalBlobStore(tmp_path), pipeline.limits_from_settings(settings)
    )
    with pytest.raises(AdapterValidationError, match="lorahost models add") as caught:
        pipeline.validate_adapter_files(_adapter_dir(adapter_dirs, tmp_path), ctx)
    assert caught.value.code == "no_base_model"


# ---- imports (registry/import_sources.py decides who may read what) ------------------------------------


@pytest.fixture
def s3_source(s3_endpoint: str, s3_bucket: str) -> S3BlobStore:
    return S3BlobStore(s3_bucket, endpoint_url=s3_endpoint)


@pytest.fixture
def s3_ctx(ctx, s3_endpoint: str) -> pipeline.AdapterJobContext:
    ctx.settings = ctx.settings.updated(s3_endpoint_url=s3_endpoint)
    return ctx


TENANT_CREDENTIALS = S3Credentials(access_key_id="tenant", secret_access_key="tenant-secret")


def _import(db_session, ctx, tenant_id: str, source: str, tmp_path: Path) -> AdapterVersion:
    work = tmp_path / "import-work"
    work.mkdir()
    version = adapter_import.accept_import(
        db_session, ctx, tenant_id=tenant_id, name="imported", visibility=None, source=source,
        credentials=TENANT_CREDENTIALS, work_dir=work,
    )  # fmt: skip
    assert version.status == "validating"
    validation_job.run_validation_job(ctx, version.id)
    db_session.expire_all()
    return repository.get_version(db_session, version.id)


def test_imports_an_s3_folder(db_session, s3_ctx, tenant_id, s3_source, adapter_dirs, tmp_path):
    for path in _adapter_dir(adapter_dirs, tmp_path).iterdir():
        s3_source.put_file(f"team/lora/{path.name}", path)
    version = _import(db_session, s3_ctx, tenant_id, f"s3://{s3_source.bucket}/team/lora", tmp_path)
    assert version.status == "ready", version.failure_reason
    assert s3_ctx.blob_store.exists(version.weights_blob_key)
    assert version.source_uri == f"s3://{s3_source.bucket}/team/lora"


def test_imports_an_s3_tar_gz_archive(db_session, s3_ctx, tenant_id, s3_source, adapter_dirs, tmp_path):
    archive = tmp_path / "lora.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(_adapter_dir(adapter_dirs, tmp_path), arcname="lora")
    s3_source.put_file("lora.tar.gz", archive)
    version = _import(db_session, s3_ctx, tenant_id, f"s3://{s3_source.bucket}/lora.tar.gz", tmp_path)
    assert version.status == "ready", version.failure_reason


def test_import_of_missing_source_is_refused_and_stores_nothing(
    db_session, s3_ctx, tenant_id, s3_source, tmp_path
):
    with pytest.raises(SourceUnreadableError):
        _import(db_session, s3_ctx, tenant_id, f"s3://{s3_source.bucket}/nothing-here", tmp_path)
    assert s3_ctx.blob_store.list_keys() == []
    assert repository.count_rows(db_session, AdapterVersion) == 0


def test_import_source_must_be_a_url_or_an_s3_uri(db_session, ctx, tenant_id, tmp_path):
    with pytest.raises(InvalidRequestError, match="s3://bucket/folder"):
        adapter_import.accept_import(
            db_session, ctx, tenant_id=tenant_id, name="x", visibility=None, source="/etc/passwd",
            credentials=None, work_dir=tmp_path,
        )  # fmt: skip


def test_job_fails_an_import_queued_before_imports_were_read_at_request_time(db_session, ctx, tenant_id):
    adapter = repository.get_or_create_adapter(db_session, tenant_id, "old", base_model_name="lorahost-base")
    version = repository.add_adapter_version(
        db_session, tenant_id, adapter, status="uploading", source_uri="s3://platform/blobs/adapters/x/y/1"
    )
    db_session.commit()
    assert validation_job.run_validation_job(ctx, version.id) == "failed"
    db_session.expire_all()
    assert repository.get_version(db_session, version.id).failure_reason.startswith("import_again")
    assert ctx.blob_store.list_keys() == []


def test_versions_stuck_in_validation_are_failed_and_their_blobs_deleted(
    db_session, ctx, tenant_id, adapter_dirs, tmp_path
):
    version = _stage(db_session, ctx, tenant_id, _adapter_dir(adapter_dirs, tmp_path))
    assert validation_job.fail_stale_versions(ctx, max_age_s=3600) == []
    assert validation_job.fail_stale_versions(ctx, max_age_s=-1) == [version.id]
    db_session.expire_all()
    version = repository.get_version(db_session, version.id)
    assert version.status == "failed" and "did not finish" in version.failure_reason
    assert ctx.blob_store.list_keys() == []


def test_a_dora_upload_is_recorded_as_dora(
    db_session, ctx, tenant_id, base_model_dir, adapter_dirs, tmp_path
):
    """The version row says DoRA (routing sends it to native workers only); a plain upload says not."""
    from gpu_workers.engine.demo_model import generate_adapter

    dora = generate_adapter(base_model_dir, tmp_path / "dora", 4, ("q_proj", "v_proj"), seed=3, use_dora=True)
    (dora / "README.md").unlink(missing_ok=True)
    version = _stage(db_session, ctx, tenant_id, dora, name="my-dora")
    assert validation_job.run_validation_job(ctx, version.id) == "ready"
    db_session.expire_all()
    assert repository.get_version(db_session, version.id).use_dora is True
    db_session.rollback()  # end the read before staging again
    plain = _stage(db_session, ctx, tenant_id, _adapter_dir(adapter_dirs, tmp_path))
    assert validation_job.run_validation_job(ctx, plain.id) == "ready"
    db_session.expire_all()
    assert repository.get_version(db_session, plain.id).use_dora is False
