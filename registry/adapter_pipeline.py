"""The adapter upload pipeline as plain functions: prepare, validate, stage, and the validation job.

Flow (the API calls the first three; a job runner, inline or Celery, calls `run_validation_job`):
  1. `prepare_adapter_dir`: filenames checked, an archive extracted -> a directory of adapter files.
  2. `validate_adapter_files`: the full pure validation against the base model (raises
     AdapterValidationError; nothing has been stored yet).
  3. `stage_upload`: blobs under `uploads/<version id>/`, then the row `status=validating` in one short
     write transaction (retried when a concurrent upload of the same name wins the adapter row or the
     version number). Any failure removes the blobs again; the DB transaction rolls back.
  4. `run_validation_job`: download, verify both files' sha256, re-validate, copy blobs to
     `adapters/<tenant>/<adapter>/<version>/`, mark `ready`, then delete the staging blobs; or mark
     `failed` with the reason and delete every blob of that version. s3:// imports (`stage_import`) start
     at this step.

Invariant after every step, whatever fails or runs concurrently: each version row's blobs exist, and each
blob belongs to a row. No transaction is held open across file or network I/O (SQLite has one writer).
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
from registry.db import is_transient_error, make_engine, make_session_factory, run_in_write_transaction
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
FINAL_STATUSES = ("ready", "failed")
IN_FLIGHT_STATUSES = ("uploading", "validating")


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
    """Get or create the adapter and add its next version in one short write transaction.

    Concurrent uploads of one name can collide on the adapter row (uq_adapters_tenant_name_live) or the
    version number (uq_adapter_versions_adapter_number); the loser's transaction is rolled back and run
    again, when it finds the winner's rows.
    """
    repository.check_adapter_name(name, reserved=(ctx.base_model_name,))

    def insert(session: Session) -> AdapterVersion:
        adapter = repository.get_or_create_adapter(
            session, tenant_id, name, base_model_name=ctx.base_model_name, visibility=visibility
        )
        return repository.add_adapter_version(session, tenant_id, adapter, **fields)

    try:
        return run_in_write_transaction(session, insert, is_retryable=_is_insert_conflict)
    except IntegrityError:
        raise ConflictError(
            f"too many uploads of adapter {name!r} were committed at the same time; retry"
        ) from None


def _is_insert_conflict(exc: BaseException) -> bool:
    return isinstance(exc, IntegrityError) or is_transient_error(exc)


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


@dataclass(frozen=True)
class StagedVersion:
    """What the validation job needs to know of a version, read in a short transaction of its own."""

    id: str
    status: str
    tenant_id: str
    adapter_id: str
    number: int
    source_uri: str | None
    config_blob_key: str | None
    weights_blob_key: str | None
    sha256: str | None
    config_sha256: str | None  # None for versions staged before config digests were recorded (0002)

    @property
    def blob_keys(self) -> list[str]:
        """The blob keys the row points at (staging keys while validating; none for a pending import)."""
        return [k for k in (self.config_blob_key, self.weights_blob_key) if k]


def run_validation_job(ctx: AdapterJobContext, version_id: str) -> str:
    """Validate a staged or imported version and mark it ready or failed; returns the final status.

    No transaction is open while files move: the version is read, the files are fetched, validated and
    put at their final keys, then one short write transaction marks it ready, and only then are the
    staging blobs deleted. Any failure marks the version failed and deletes every blob of it, so no row
    points at a missing blob and no blob is left without a row.
    Idempotent: a version already ready or failed is left as it is (safe under job re-delivery).
    """
    staged = _load_staged(ctx, version_id)
    if staged.status in FINAL_STATUSES:
        return staged.status
    dest = final_keys(staged.tenant_id, staged.adapter_id, staged.number)
    try:
        info, digests = _fetch_and_validate(ctx, staged, dest)
        status = _mark_ready(ctx, staged.id, dest, info, digests)
    except Exception as exc:  # noqa: BLE001 - any failure becomes the version's failure reason
        return _mark_failed(ctx, staged, dest, exc)
    if status == "failed":  # failed meanwhile (fail_stale_versions): the row points at no blob
        _delete_keys(ctx.blob_store, dest.values())
    _delete_keys(ctx.blob_store, staged.blob_keys)
    return status


def _load_staged(ctx: AdapterJobContext, version_id: str) -> StagedVersion:
    with ctx.session_factory() as session:
        version = repository.get_version(session, version_id)
        return StagedVersion(
            id=version.id,
            status=version.status,
            tenant_id=version.adapter.tenant_id,
            adapter_id=version.adapter_id,
            number=version.number,
            source_uri=version.source_uri,
            config_blob_key=version.config_blob_key,
            weights_blob_key=version.weights_blob_key,
            sha256=version.sha256,
            config_sha256=version.config_sha256,
        )


def _mark_ready(
    ctx: AdapterJobContext, version_id: str, dest: dict[str, str], info: AdapterInfo, digests: dict[str, str]
) -> str:
    """Point a still in-flight version at its final blobs and mark it ready; returns its status after."""

    def update(session: Session) -> str:
        version = repository.get_version(session, version_id)
        if version.status in FINAL_STATUSES:
            return version.status
        version.status = "ready"
        version.config_blob_key = dest[CONFIG_FILENAME]
        version.weights_blob_key = dest[WEIGHTS_FILENAME]
        version.failure_reason = None
        version.finished_at = utcnow()
        for key, value in {**digests, **_info_fields(info)}.items():
            setattr(version, key, value)
        return "ready"

    with ctx.session_factory() as session:
        return run_in_write_transaction(session, update)


def _fetch_and_validate(
    ctx: AdapterJobContext, staged: StagedVersion, dest: dict[str, str]
) -> tuple[AdapterInfo, dict[str, str]]:
    """Bring the files to a temp dir, verify and re-validate them, then put them at their final keys."""
    with tempfile.TemporaryDirectory(prefix="lorahost-job-") as tmp:
        work = Path(tmp)
        if staged.source_uri and not staged.weights_blob_key:
            adapter_dir = _fetch_import(ctx, staged.source_uri, work)
        else:
            adapter_dir = _fetch_staged(ctx, staged, work)
        info = validate_adapter_files(adapter_dir, ctx)
        digests = file_digests(adapter_dir)
        for filename, key in dest.items():
            ctx.blob_store.put_file(key, adapter_dir / filename)
    return info, digests


def _fetch_staged(ctx: AdapterJobContext, version: StagedVersion, work: Path) -> Path:
    adapter_dir = work / "adapter"
    adapter_dir.mkdir()
    ctx.blob_store.download_to(version.config_blob_key or "", adapter_dir / CONFIG_FILENAME)
    ctx.blob_store.download_to(version.weights_blob_key or "", adapter_dir / WEIGHTS_FILENAME)
    _check_staged_digests(version, adapter_dir)
    return adapter_dir


def _check_staged_digests(version: StagedVersion, adapter_dir: Path) -> None:
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


def _mark_failed(ctx: AdapterJobContext, staged: StagedVersion, dest: dict[str, str], exc: Exception) -> str:
    """Mark a still in-flight version failed with the reason, then delete its staging and final blobs.

    If even that write fails, the final blobs are deleted and the error raised: the row stays in flight
    pointing at its staging blobs, and fail_stale_versions fails it later.
    """
    reason = _failure_reason(staged.id, exc)

    def update(session: Session) -> str:
        version = repository.get_version(session, staged.id)
        if version.status in FINAL_STATUSES:
            return version.status
        _set_failed(version, reason)
        return "failed"

    try:
        with ctx.session_factory() as session:
            status = run_in_write_transaction(session, update)
    except BaseException:
        _delete_keys(ctx.blob_store, dest.values())
        raise
    if status != "ready":  # a concurrent run of this job that succeeded owns the final blobs
        _delete_keys(ctx.blob_store, dest.values())
    _delete_keys(ctx.blob_store, staged.blob_keys)
    return status


def _failure_reason(version_id: str, exc: Exception) -> str:
    if isinstance(exc, AdapterValidationError):
        return f"{exc.code}: {exc.message}"
    log.error("validation job for version %s failed", version_id, exc_info=exc)
    return f"internal error while validating ({type(exc).__name__}: {exc}); upload again or contact support"


def _set_failed(version: AdapterVersion, reason: str) -> None:
    version.status = "failed"
    version.failure_reason = reason
    version.config_blob_key = None
    version.weights_blob_key = None
    version.finished_at = utcnow()


def make_job_context(settings: Settings) -> AdapterJobContext:
    """A context with its own engine and blob store, built from settings (Celery workers, CLI)."""
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
    e.g. the process died mid-job) and delete their blobs. Returns the ids it failed.

    The rows are committed first and the blobs deleted after, so no row ever points at a deleted blob.
    """
    cutoff = utcnow() - timedelta(seconds=max_age_s)
    reason = f"validation did not finish within {int(max_age_s)} s; upload the adapter again"

    def update(session: Session) -> list[tuple[str, list[str]]]:
        stale = session.scalars(
            select(AdapterVersion).where(
                AdapterVersion.status.in_(IN_FLIGHT_STATUSES), AdapterVersion.created_at < cutoff
            )
        ).all()
        failed = [(v.id, [k for k in (v.config_blob_key, v.weights_blob_key) if k]) for v in stale]
        for version in stale:
            _set_failed(version, reason)
        return failed

    with ctx.session_factory() as session:
        failed = run_in_write_transaction(session, update)
    for _, keys in failed:
        _delete_keys(ctx.blob_store, keys)
    return [version_id for version_id, _ in failed]
