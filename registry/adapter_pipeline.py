"""The adapter upload pipeline as plain functions: prepare, validate, stage (steps 1-3, here), and the
validation job (step 4, registry/validation_job.py), with the context they share.

Flow (the API calls the first three; a job runner, inline or Celery, calls `validation_job.run_validation_job`):
  1. `prepare_adapter_dir`: filenames checked, an archive extracted -> a directory of adapter files.
  2. `validate_adapter_files`: the full pure validation against the base model (raises
     AdapterValidationError; nothing has been stored yet).
  3. `stage_upload`: blobs under `uploads/<version id>/`, then the row `status=validating` in one short
     write transaction (retried when a concurrent upload of the same name wins the adapter row or the
     version number). Any failure removes the blobs again; the DB transaction rolls back.
  4. `run_validation_job`: download, verify both files' sha256, re-validate, copy blobs to
     `adapters/<tenant>/<adapter>/<version>/`, mark `ready`, then delete the staging blobs; or mark
     `failed` with the reason and delete every blob of that version.
Imports (`accept_import`) read their source at request time (registry/import_sources.py: which locations, with
whose credentials), then take steps 1-4 like an upload.

Invariant after every step, whatever fails or runs concurrently: each version row's blobs exist, and each
blob belongs to a row. No transaction is held open across file or network I/O (SQLite has one writer).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from registry import repository, upload_quota
from registry.archive import extract_archive, is_archive_name
from registry.blob_locations import make_blob_store
from registry.db import is_insert_conflict, make_engine, make_session_factory, run_in_write_transaction
from registry.digests import sha256_file
from registry.errors import ConflictError
from registry.import_sources import (
    S3Credentials,
    check_import_allowed,
    parse_import_source,
    read_import_source,
)
from registry.models import AdapterVersion, new_id
from registry.storage import BlobStore
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
from settings import Settings

log = logging.getLogger(__name__)

STORED_FILENAMES = (CONFIG_FILENAME, WEIGHTS_FILENAME)
FINAL_STATUSES = ("ready", "failed")
IN_FLIGHT_STATUSES = ("uploading", "validating")


def limits_from_settings(settings: Settings) -> ValidationLimits:
    """The validation limits configured in settings."""
    return ValidationLimits(
        max_rank=settings.limits.max_rank,
        max_adapter_bytes=settings.limits.max_adapter_bytes,
        max_uncompressed_bytes=settings.limits.max_uncompressed_bytes,
        max_archive_members=settings.limits.max_archive_members,
    )


@dataclass
class AdapterJobContext:
    """What the upload pipeline needs: DB sessions, the blob store, the base model and the limits.

    Built once per process (API lifespan, Celery worker) and passed to every pipeline call.
    """

    settings: Settings
    session_factory: sessionmaker[Session]
    blob_store: BlobStore
    limits: ValidationLimits

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
    source_uri: str | None = None,
) -> AdapterVersion:
    """Store a validated adapter under temporary keys and commit its `validating` version row
    (`source_uri`: where an import came from, without credentials or query string).

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
            source_uri=source_uri,
            **file_digests(adapter_dir),
            **info_fields(info),
        )
    except BaseException:
        session.rollback()
        delete_keys(ctx.blob_store, keys.values())
        raise
    return version


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

    The plan's adapter-count and stored-bytes quotas are checked in the same transaction, after locking the
    tenant's row (registry/upload_quota.py): concurrent uploads cannot pass a quota together.
    Concurrent uploads of one name can collide on the adapter row (uq_adapters_tenant_name_live) or the
    version number (uq_adapter_versions_adapter_number); the loser's transaction is rolled back and run
    again, when it finds the winner's rows.
    """
    repository.check_adapter_name(name, reserved=(ctx.base_model_name,))

    def insert(session: Session) -> AdapterVersion:
        quota = upload_quota.lock_tenant_quota(session, tenant_id)  # first: concurrent uploads count in turn
        upload_quota.check_upload_quota(
            session,
            tenant_id,
            quota,
            is_new_adapter=repository.get_own_adapter(session, tenant_id, name) is None,
            num_bytes=int(fields["num_bytes"]),  # type: ignore[call-overload]  # known: imports are read first
        )
        adapter = repository.get_or_create_adapter(
            session, tenant_id, name, base_model_name=ctx.base_model_name, visibility=visibility
        )
        return repository.add_adapter_version(session, tenant_id, adapter, **fields)

    try:
        return run_in_write_transaction(session, insert, is_retryable=is_insert_conflict)
    except IntegrityError:
        raise ConflictError(
            f"too many uploads of adapter {name!r} were committed at the same time; retry"
        ) from None


def info_fields(info: AdapterInfo) -> dict[str, object]:
    """The version row's columns that come from a validated adapter."""
    return {
        "rank": info.rank,
        "alpha": info.alpha,
        "target_modules": list(info.target_modules),
        "num_bytes": info.num_bytes,
    }


def delete_keys(store: BlobStore, keys: object) -> None:
    """Delete blobs, logging (not raising) failures: cleanup must not hide the error that caused it."""
    for key in keys:  # type: ignore[attr-defined]
        try:
            store.delete(key)
        except Exception:  # cleanup must not hide the original error
            log.exception("could not delete blob %s", key)


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
    source_uri: str | None = None,
) -> AdapterVersion:
    """Steps 1-3 for files already on local disk: prepare, fully validate, then stage (blocking)."""
    repository.check_adapter_name(name, reserved=(ctx.base_model_name,))
    if visibility is not None:
        repository.check_visibility(visibility)
    check_incoming_names(names)
    precheck_quota(session, tenant_id, name, num_bytes=_sent_weights_bytes(upload_dir, names))
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
        source_uri=source_uri,
    )


def accept_import(
    session: Session,
    ctx: AdapterJobContext,
    *,
    tenant_id: str,
    name: str,
    visibility: str | None,
    source: str,
    credentials: S3Credentials | None,
    work_dir: Path,
) -> AdapterVersion:
    """An import: refuse what this tenant may not read before reading anything, read the source into
    `work_dir` (registry/import_sources.py), then steps 1-3 as for an upload, its quotas included (blocking)."""
    repository.check_adapter_name(name, reserved=(ctx.base_model_name,))
    if visibility is not None:
        repository.check_visibility(visibility)
    parsed = parse_import_source(source, ctx.settings)
    check_import_allowed(parsed, credentials, ctx.settings)
    names = read_import_source(
        parsed, credentials, ctx.settings, work_dir, ctx.settings.limits.max_upload_bytes
    )
    return accept_upload(
        session,
        ctx,
        tenant_id=tenant_id,
        name=name,
        visibility=visibility,
        upload_dir=work_dir,
        names=names,
        source_uri=parsed.redacted,
    )


def precheck_quota(session: Session, tenant_id: str, name: str, *, num_bytes: int) -> None:
    """Refuse early (before extracting and validating) an upload the plan's quotas have no room for.

    A read only, ended before returning; `_insert_version` checks again in its write transaction (the
    authoritative check: uploads running meanwhile may have used the room).
    """
    try:
        quota = upload_quota.read_quota(session, tenant_id)
        is_new_adapter = repository.get_own_adapter(session, tenant_id, name) is None
        upload_quota.check_upload_quota(
            session, tenant_id, quota, is_new_adapter=is_new_adapter, num_bytes=num_bytes
        )
    finally:
        session.commit()  # end the read: staging starts a write transaction of its own


def _sent_weights_bytes(upload_dir: Path, names: list[str]) -> int:
    """Size of adapter_model.safetensors when sent as is (0 for an archive: known once extracted)."""
    return (upload_dir / WEIGHTS_FILENAME).stat().st_size if WEIGHTS_FILENAME in names else 0
