"""Upload quotas in the registry (SQLite + PostgreSQL): what counts as stored bytes and adapters, and imports,
which are read during the request and then get the same quotas as an upload (moto S3, an allow-listed bucket).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from registry import adapter_import, repository, upload_quota, validation_job
from registry import adapter_pipeline as pipeline
from registry.errors import AdapterQuotaError, StorageQuotaError
from registry.models import AdapterVersion
from registry.s3_storage import S3BlobStore
from registry.storage import LocalBlobStore
from settings import Settings


@pytest.fixture
def source_store(s3_endpoint: str, s3_bucket: str) -> S3BlobStore:
    """The bucket imports read from: allow-listed by `ctx`, so read with the platform's credentials."""
    return S3BlobStore(s3_bucket, endpoint_url=s3_endpoint)


@pytest.fixture
def ctx(
    tmp_path: Path,
    base_model_dir: Path,
    db_session_factory: sessionmaker[Session],
    source_store: S3BlobStore,
    s3_endpoint: str,
) -> pipeline.AdapterJobContext:
    settings = Settings(
        data_dir=tmp_path,
        base_model_path=base_model_dir,
        admin_key="x",
        s3_endpoint_url=s3_endpoint,
        import_allowed_buckets=source_store.bucket,
    )
    return pipeline.AdapterJobContext(
        settings=settings,
        session_factory=db_session_factory,
        blob_store=LocalBlobStore(tmp_path / "blobs"),
        limits=pipeline.limits_from_settings(settings),
    )


def _tenant_on_plan(db_session: Session, **quotas: int) -> str:
    plan = repository.create_price_plan(db_session, f"plan-{len(quotas)}", **quotas)
    tenant = repository.create_tenant(db_session, "acme", plan_id=plan.id)
    db_session.commit()
    return tenant.id


def _add_version(
    db_session: Session, tenant_id: str, name: str, status: str, num_bytes: int
) -> AdapterVersion:
    adapter = repository.get_or_create_adapter(db_session, tenant_id, name, base_model_name="base")
    version = repository.add_adapter_version(
        db_session, tenant_id, adapter, status=status, num_bytes=num_bytes
    )
    db_session.commit()
    return version


def test_failed_versions_and_deleted_adapters_free_their_bytes(db_session: Session) -> None:
    tenant_id = _tenant_on_plan(db_session, max_stored_bytes=100)
    _add_version(db_session, tenant_id, "a", "ready", 40)
    _add_version(db_session, tenant_id, "a", "failed", 1000)
    _add_version(db_session, tenant_id, "b", "validating", 30)
    _add_version(db_session, tenant_id, "c", "ready", 20)
    repository.soft_delete_adapter(db_session, tenant_id, "c")
    db_session.commit()
    assert upload_quota.num_stored_bytes(db_session, tenant_id) == 70
    assert upload_quota.num_live_adapters(db_session, tenant_id) == 2
    quota = upload_quota.read_quota(db_session, tenant_id)
    upload_quota.check_stored_bytes(db_session, tenant_id, quota, 30)  # exactly up to the limit
    with pytest.raises(StorageQuotaError, match=r"at most 100 stored bytes \(max_stored_bytes\)"):
        upload_quota.check_stored_bytes(db_session, tenant_id, quota, 31)


def test_tenant_without_plan_has_no_quota(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "free")
    db_session.commit()
    assert upload_quota.read_quota(db_session, tenant.id) == upload_quota.UploadQuota()


def _put_source(source_store: S3BlobStore, adapter_dirs: dict[str, Path], tmp_path: Path) -> int:
    src = next(iter(adapter_dirs.values()))
    for name in pipeline.STORED_FILENAMES:
        shutil.copyfile(src / name, tmp_path / name)
        source_store.put_file(f"lora/{name}", tmp_path / name)
    return (src / pipeline.WEIGHTS_FILENAME).stat().st_size


def _import(
    db_session: Session, ctx: pipeline.AdapterJobContext, tenant_id: str, name: str, tmp_path: Path
) -> AdapterVersion:
    db_session.commit()  # end the previous read: staging starts a write transaction
    source = f"s3://{ctx.settings.api.import_allowed_buckets[0]}/lora"
    work_dir = tmp_path / f"import-{len(list(tmp_path.glob('import-*')))}"
    work_dir.mkdir()
    version = adapter_import.accept_import(
        db_session, ctx, tenant_id=tenant_id, name=name, visibility=None, source=source, credentials=None,
        work_dir=work_dir,
    )  # fmt: skip
    validation_job.run_validation_job(ctx, version.id)
    db_session.expire_all()
    return repository.get_version(db_session, version.id)


def test_import_over_the_stored_bytes_quota_is_refused_and_stores_nothing(
    db_session: Session, ctx: pipeline.AdapterJobContext, source_store, adapter_dirs, tmp_path: Path
) -> None:
    num_bytes = _put_source(source_store, adapter_dirs, tmp_path)
    tenant_id = _tenant_on_plan(db_session, max_stored_bytes=num_bytes)
    first = _import(db_session, ctx, tenant_id, "first", tmp_path)
    assert first.status == "ready" and first.num_bytes == num_bytes  # known when its row was inserted
    stored_keys = ctx.blob_store.list_keys()
    with pytest.raises(StorageQuotaError, match=r"at most \d+ stored bytes \(max_stored_bytes\)"):
        _import(db_session, ctx, tenant_id, "second", tmp_path)
    assert ctx.blob_store.list_keys() == stored_keys  # only the first import's two files
    assert repository.count_rows(db_session, AdapterVersion) == 1
    assert upload_quota.num_stored_bytes(db_session, tenant_id) == num_bytes


def test_import_over_the_adapter_count_quota_is_refused_and_stores_nothing(
    db_session: Session, ctx: pipeline.AdapterJobContext, source_store, adapter_dirs, tmp_path: Path
) -> None:
    _put_source(source_store, adapter_dirs, tmp_path)
    tenant_id = _tenant_on_plan(db_session, max_adapters=1)
    assert _import(db_session, ctx, tenant_id, "first", tmp_path).status == "ready"
    stored_keys = ctx.blob_store.list_keys()
    with pytest.raises(AdapterQuotaError, match=r"at most 1 adapters \(max_adapters\)"):
        _import(db_session, ctx, tenant_id, "second", tmp_path)
    assert ctx.blob_store.list_keys() == stored_keys
    assert repository.count_rows(db_session, AdapterVersion) == 1
    version_2 = _import(db_session, ctx, tenant_id, "first", tmp_path)  # a new version is not a new adapter
    assert version_2.number == 2
