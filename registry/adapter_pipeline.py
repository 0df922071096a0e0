"""The adapter upload pipeline as plain functions: prepare, validate, stage, and the validation job.

Flow (the API calls the first three; a job runner, inline or Celery, calls `run_validation_job`):
  1. `prepare_adapter_dir`: filenames checked, an archive extracted -> a directory of adapter files.
  2. `validate_adapter_files`: the full pure validation against the base model (raises
     AdapterValidationError; nothing has been stored yet).
  3. `stage_upload`: blobs under `uploads/<version id>/`, then the row `status=validating`.
     Any failure removes the blobs again; the DB transaction rolls back.
  4. `run_validation_job`: download, verify both files' sha256, re-validate, move blobs to
     `adapters/<tenant>/<adapter>/<version>/`, mark `ready`; or mark `failed` with the reason and delete
     every blob of that version. s3:// imports (`stage_import`) start at this step.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from pathlib import Path, PurePosixPath

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from registry import repository
from registry.archive import extract_archive, is_archive_name
from registry.digests import sha256_file
from registry.errors import ConflictError, InvalidRequestError
from registry.models import AdapterVersion, new_id, utcnow
from registry.settings import Settings
from registry.storage import BlobStore, make_blob_store, parse_s3_uri
from registry.validation import (
    CONFIG_FILENAME,
    WEIGHTS_FILENAME,
    AdapterInfo,
    AdapterValidationError,
    BaseModelSpec,
    ValidationLimits,
    check_upload_filenames,
    validate_adapter_dir,
)

log = logging.getLogger(__name__)

STORED_FILENAMES = (CONFIG_FILENAME, WEIGHTS_FILENAME)


def limits_from_settings(settings: Settings) -> ValidationLimits:
    """The validation limits configured in settings."""
    return ValidationLimits(
        max_rank=settings.max_rank,
        max_adapter_bytes=settings.max_adapter_bytes,
        max_uncompressed_bytes=settings.max_uncompressed_bytes,
        max_archive_members=settings.max_archive_members,
    )


@dataclass
class AdapterJobContext:
    """What the upload pipeline needs: DB sessions, the blob store, the base model and the limits.

    Built once per process (API lifespan, Celery worker) and passed to every pipeline call.
    `source_store_for` opens the blob store behind an s3:// import source.
    """

    settings: Settings
    session_factory: sessionmaker[Session]
    blob_store: BlobStore
    limits: ValidationLimits
    source_store_for: Callable[[str], BlobStore] = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.source_store_for is None:
            self.source_store_for = lambda uri: make_blob_store(self.settings, uri)

    @cached_property
    def base_model_spec(self) -> BaseModelSpec:
        """The configured base model's dimensions (read from its config.json on first use)."""
        if self.settings.base_model_path is None:
            raise AdapterValidationError(
                "no_base_model", "the server has no base model configured; set LORAHOST_BASE_MODEL_PATH"
            )
        return BaseModelSpec.from_model_dir(self.settings.base_model_path)

    @property
    def base_model_name(self) -> str:
        """The served base model's public name."""
        return self.settings.base_model_name


# ---- steps 1-2: local files ----------------------------------------------------------------------


def safe_basename(name: str) -> str:
    """The last path component of a client-sent file name (clients may send `dir/file`)."""
    return PurePosixPath(name.replace("\\", "/")).name


def check_incoming_names(names: list[str]) -> None:
    """Accept one archive, or the adapter's files (refused before any byte is written to disk)."""
    if len(names) == 1 and is_archive_name(names[0]):
        return
    if any(is_archive_name(n) for n in names):
        raise AdapterValidationError(
            "unexpected_file", "send either one archive (.zip/.tar.gz/.tar) or the adapter's files, not both"
        )
    check_upload_filenames(names)


def prepare_adapter_dir(upload_dir: Path, names: list[str], limits: ValidationLimits) -> Path:
    """The directory holding the adapter's files: `upload_dir` itself, or the extracted archive."""
    if not (len(names) == 1 and is_archive_name(names[0])):
        return upload_dir
    dest = upload_dir / "extracted"
    extract_archive(upload_dir / names[0], dest, limits)  # flat: a single wrapping folder is removed
    return dest


def validate_adapter_files(adapter_dir: Path, ctx: AdapterJobContext) -> AdapterInfo:
    """Full pure validation of an adapter directory against the base model (AdapterValidationError)."""
    return validate_adapter_dir(adapter_dir, ctx.base_model_spec, ctx.limits)


def file_digests(adapter_dir: Path) -> dict[str, str]:
    """A version row's digest fields: `sha256` of the weights and `config_sha256` of adapter_config.json.

    Workers key their caches by both (two versions may share weights and differ in lora_alpha).
    """
    return {
        "sha256": sha256_file(adapter_dir / WEIGHTS_FILENAME),
        "config_sha256": sha256_file(adapter_dir / CONFIG_FILENAME),
    }


# ---- step 3: staging ---------------------------------------------------------------------------


def staging_keys(version_id: str) -> dict[str, str]:
    """Temporary blob keys of a version still being validated."""
    return {name: f"uploads/{version_id}/{name}" for name in STORED_FILENAMES}


def final_keys(tenant_id: str, adapter_id: str, version_number: int) -> dict[str, str]:
    """Blob keys of a ready version."""
    return {name: f"adapters/{tenant_id}/{adapter_id}/{version_number}/{name}" for name in STORED_FILENAMES}


def stage_upload(
    session: Session,
    ctx: AdapterJobContext,
    *,
    tenant_id: str,
    name: str,
    visibility: str | None,
    adapter_dir: Path,
    info: AdapterInfo,
) -> AdapterVersion:
    """Store a validated adapter under temporary keys and commit its `validating` version row.

    On any failure the blobs are deleted and the transaction rolled back: nothing is left stored.
    """
    version_id = new_id()
    keys = staging_keys(version_id)
    try:
        for filename, key in keys.items():
            ctx.blob_store.put_file(key, adapter_dir / filename)
        version = _insert_version(
            session,
            ctx,
            tenant_id=tenant_id,
            name=name,
            visibility=visibility,
            id=version_id,
            status="validating",
            config_blob_key=keys[CONFIG_FILENAME],
            weights_blob_key=keys[WEIGHTS_FILENAME],
            **file_digests(adapter_dir),
            **_info_fields(info),
        )
    except BaseException:
        session.rollback()
        _delete_keys(ctx.blob_store, keys.values())
        raise
    return version


def stage_import(
    session: Session,
    ctx: AdapterJobContext,
    *,
    tenant_id: str,
    name: str,
    visibility: str | None,
    source: str,
) -> AdapterVersion:
    """Commit an `uploading` version whose files the validation job fetches from an s3:// source."""
    try:
        parse_s3_uri(source)
    except ValueError as exc:
        raise InvalidRequestError(
            f"{exc}; give source as s3://bucket/prefix (a folder with {CONFIG_FILENAME} and "
            f"{WEIGHTS_FILENAME}) or s3://bucket/key.zip|.tar.gz",
            code="invalid_source",
        ) from None
    return _insert_version(
        session,
        ctx,
        tenant_id=tenant_id,
        name=name,
        visibility=visibility,
        status="uploading",
        source_uri=source,
    )


def _insert_version(
    session: Session,
    ctx: AdapterJobContext,
    *,
    tenant_id: str,
    name: str,
    visibility: str | None,
    **fields: object,
) -> AdapterVersion:
    repository.check_adapter_name(name, reserved=(ctx.base_model_name,))
    try:
        adapter = repository.get_or_create_adapter(
            session, tenant_id, name, base_model_name=ctx.base_model_name, visibility=visibility
        )
        version = repository.add_adapter_version(session, tenant_id, adapter, **fields)
        session.commit()
    except IntegrityError:
        session.rollback()
        raise ConflictError(
            f"another upload of adapter {name!r} was committed at the same time; retry"
        ) from None
    return version


def _info_fields(info: AdapterInfo) -> dict[str, object]:
    return {
        "rank": info.rank,
        "alpha": info.alpha,
        "target_modules": list(info.target_modules),
        "num_bytes": info.num_bytes,
    }


def _delete_keys(store: BlobStore, keys: object) -> None:
    for key in keys:  # type: ignore[attr-defined]
        try:
            store.delete(key)
        except Exception:  # cleanup must not hide the original error
            log.exception("could not delete blob %s", key)


# ---- step 4: the validation job ----------------------------------------------------------------


def run_validation_job(ctx: AdapterJobContext, version_id: str) -> str:
    """Validate a staged or imported version and mark it ready or failed; returns the final status.

    Idempotent: a version already ready or failed is left as it is (safe under job re-delivery).
    """
    with ctx.session_factory() as session:
        version = repository.get_version(session, version_id)
        if version.status in ("ready", "failed"):
            return version.status
        adapter = version.adapter
        dest = final_keys(adapter.tenant_id, adapter.id, version.number)
        try:
            info, digests = _fetch_and_validate(ctx, version, dest)
        except Exception as exc:  # noqa: BLE001 - any failure becomes the version's failure reason
            return _mark_failed(session, ctx, version, dest, exc)
        version.status = "ready"
        version.config_blob_key = dest[CONFIG_FILENAME]
        version.weights_blob_key = dest[WEIGHTS_FILENAME]
        version.failure_reason = None
        version.finished_at = utcnow()
        for key, value in {**digests, **_info_fields(info)}.items():
            setattr(version, key, value)
        session.commit()
        return "ready"


def _fetch_and_validate(
    ctx: AdapterJobContext, version: AdapterVersion, dest: dict[str, str]
) -> tuple[AdapterInfo, dict[str, str]]:
    """Bring the files to a temp dir, verify and re-validate them, then put them at their final keys."""
    with tempfile.TemporaryDirectory(prefix="lorahost-job-") as tmp:
        work = Path(tmp)
        if version.source_uri and not version.weights_blob_key:
            adapter_dir = _fetch_import(ctx, version.source_uri, work)
        else:
            adapter_dir = _fetch_staged(ctx, version, work)
        info = validate_adapter_files(adapter_dir, ctx)
        digests = file_digests(adapter_dir)
        for filename, key in dest.items():
            ctx.blob_store.put_file(key, adapter_dir / filename)
    if version.config_blob_key and version.weights_blob_key:
        _delete_keys(ctx.blob_store, [version.config_blob_key, version.weights_blob_key])
    return info, digests


def _fetch_staged(ctx: AdapterJobContext, version: AdapterVersion, work: Path) -> Path:
    adapter_dir = work / "adapter"
    adapter_dir.mkdir()
    ctx.blob_store.download_to(version.config_blob_key or "", adapter_dir / CONFIG_FILENAME)
    ctx.blob_store.download_to(version.weights_blob_key or "", adapter_dir / WEIGHTS_FILENAME)
    _check_staged_digests(version, adapter_dir)
    return adapter_dir


def _check_staged_digests(version: AdapterVersion, adapter_dir: Path) -> None:
    """checksum_mismatch unless both staged files still have the digests recorded when they were staged."""
    expected = {WEIGHTS_FILENAME: version.sha256, CONFIG_FILENAME: version.config_sha256}
    for filename, digest in expected.items():
        if filename == CONFIG_FILENAME and digest is None:
            continue  # staged before config digests were recorded (migration 0002)
        actual = sha256_file(adapter_dir / filename)
        if actual != digest:
            raise AdapterValidationError(
                "checksum_mismatch",
                f"stored {filename} has sha256 {actual}, expected {digest}; upload it again",
            )


def _fetch_import(ctx: AdapterJobContext, source: str, work: Path) -> Path:
    """Download an s3:// folder (adapter files) or a single archive key into `work`."""
    bucket, prefix = parse_s3_uri(source)
    store = ctx.source_store_for(f"s3://{bucket}")
    incoming = work / "incoming"
    incoming.mkdir()
    if is_archive_name(prefix):
        names = [safe_basename(prefix)]
        store.download_to(prefix, incoming / names[0])
    else:
        folder = f"{prefix}/" if prefix else ""
        keys = [k for k in store.list_keys(folder) if "/" not in k[len(folder) :]]
        names = [safe_basename(k) for k in keys]
        if not names:
            raise AdapterValidationError("missing_config", f"no files found under {source}")
        check_incoming_names(names)
        for key, filename in zip(keys, names):
            store.download_to(key, incoming / filename)
    check_incoming_names(names)
    return prepare_adapter_dir(incoming, names, ctx.limits)


def _mark_failed(
    session: Session, ctx: AdapterJobContext, version: AdapterVersion, dest: dict[str, str], exc: Exception
) -> str:
    if isinstance(exc, AdapterValidationError):
        reason = f"{exc.code}: {exc.message}"
    else:
        log.exception("validation job for version %s failed", version.id)
        reason = (
            f"internal error while validating ({type(exc).__name__}: {exc}); upload again or contact support"
        )
    keys = [k for k in (version.config_blob_key, version.weights_blob_key) if k] + list(dest.values())
    _delete_keys(ctx.blob_store, keys)
    session.rollback()
    version = repository.get_version(session, version.id)
    version.status = "failed"
    version.failure_reason = reason
    version.config_blob_key = None
    version.weights_blob_key = None
    version.finished_at = utcnow()
    session.commit()
    return "failed"


def make_job_context(settings: Settings) -> AdapterJobContext:
    """A context with its own engine and blob store, built from settings (Celery workers, CLI)."""
    from registry.db import make_engine, make_session_factory

    engine = make_engine(settings.resolved_database_url())
    return AdapterJobContext(
        settings=settings,
        session_factory=make_session_factory(engine),
        blob_store=make_blob_store(settings),
        limits=limits_from_settings(settings),
    )


def accept_upload(
    session: Session,
    ctx: AdapterJobContext,
    *,
    tenant_id: str,
    name: str,
    visibility: str | None,
    upload_dir: Path,
    names: list[str],
) -> AdapterVersion:
    """Steps 1-3 for files already on local disk: prepare, fully validate, then stage (blocking)."""
    repository.check_adapter_name(name, reserved=(ctx.base_model_name,))
    if visibility is not None:
        repository.check_visibility(visibility)
    check_incoming_names(names)
    adapter_dir = prepare_adapter_dir(upload_dir, names, ctx.limits)
    info = validate_adapter_files(adapter_dir, ctx)
    return stage_upload(
        session,
        ctx,
        tenant_id=tenant_id,
        name=name,
        visibility=visibility,
        adapter_dir=adapter_dir,
        info=info,
    )


def fail_stale_versions(ctx: AdapterJobContext, max_age_s: float) -> list[str]:
    """Mark versions stuck in uploading/validating for longer than `max_age_s` failed (their job was lost,
    e.g. the process died mid-job) and delete their blobs. Returns the ids it failed."""
    cutoff = utcnow() - timedelta(seconds=max_age_s)
    with ctx.session_factory() as session:
        stale = session.scalars(
            select(AdapterVersion).where(
                AdapterVersion.status.in_(("uploading", "validating")), AdapterVersion.created_at < cutoff
            )
        ).all()
        for version in stale:
            keys = [k for k in (version.config_blob_key, version.weights_blob_key) if k]
            _delete_keys(ctx.blob_store, keys)
            version.status = "failed"
            version.failure_reason = (
                f"validation did not finish within {int(max_age_s)} s; upload the adapter again"
            )
            version.config_blob_key = version.weights_blob_key = None
            version.finished_at = utcnow()
        session.commit()
        return [v.id for v in stale]
