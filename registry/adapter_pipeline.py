"""The adapter upload pipeline as plain functions: prepare, validate, stage (steps 1-3, here), and the
validation job (step 4, registry/validation_job.py), with the context they share.

Flow (the API calls the first three; a job runner, inline or Celery, calls `validation_job.run_validation_job`):
  1. `prepare_adapter_dir`: filenames checked, an archive extracted -> a directory of adapter files.
  2. `validate_adapter_files`: the full pure validation against the adapter's base model (registry/
     base_model_choice.py: the upload's `base_model`, else the one adapter_config.json names; raises
     AdapterValidationError; nothing has been stored yet).
  3. `stage_upload`: blobs under `uploads/<version id>/`, then the row `status=validating` in one short
     write transaction (retried when a concurrent upload of the same name wins the adapter row or the
     version number). Any failure removes the blobs again; the DB transaction rolls back.
  4. `run_validation_job`: download, verify both files' sha256, re-validate, copy blobs to
     `adapters/<tenant>/<adapter>/<version>/`, mark `ready`, then delete the staging blobs; or mark
     `failed` with the reason and delete every blob of that version.
Imports (registry/adapter_import.py `accept_import`) read their source at request time (registry/import_sources.py: which locations, with
whose credentials), then take steps 1-4 like an upload.

Invariant after every step, whatever fails or runs concurrently: each version row's blobs exist, and each
blob belongs to a row. No transaction is held open across file or network I/O (SQLite has one writer).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path, PurePosixPath

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from registry import model_names, repository, upload_quota
from registry.archive import extract_archive, is_archive_name
from registry.base_model_choice import (
    BaseModelChoice,
    available_base_models,
    choose_base_model,
    names_of,
    peek_config_base,
    validate_for_base,
)
from registry.blob_locations import make_blob_store
from registry.db import is_insert_conflict, make_engine, make_session_factory, run_in_write_transaction
from registry.digests import sha256_file
from registry.errors import ConflictError, StorageQuotaError
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
    def local_base_spec(self) -> BaseModelSpec | None:
        """The configured local base model's dimensions (its config.json, read on first use); None when no
        local model is configured (the catalog's models only)."""
        if self.settings.base_model_path is None:
            return None
        return BaseModelSpec.from_model_dir(self.settings.base_model_path)

    def base_model_choices(self, session: Session) -> list[BaseModelChoice]:
        """The base models adapters may be bound to now (the catalog's and the configured one)."""
        return available_base_models(session, self.settings, self.local_base_spec)

    def read_base_model_choices(self) -> list[BaseModelChoice]:
        """`base_model_choices` in a short read of its own."""
        with self.session_factory() as session:
            return self.base_model_choices(session)


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


def validate_adapter_files(
    adapter_dir: Path,
    ctx: AdapterJobContext,
    base_model: str | None = None,
    choices: list[BaseModelChoice] | None = None,
) -> tuple[AdapterInfo, BaseModelChoice]:
    """Full pure validation of an adapter directory against its base model: `base_model` (the adapter's, or
    the upload's choice), else the one adapter_config.json names, else the only one (AdapterValidationError
    listing the available bases). Returns what was validated and the base it is for."""
    choices = ctx.read_base_model_choices() if choices is None else choices
    chosen = choose_base_model(
        choices, requested=None, bound=base_model, config_base=peek_config_base(adapter_dir)
    )
    return validate_for_base(adapter_dir, chosen, choices, ctx.limits), chosen


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
    base_model_name: str,
    source_uri: str | None = None,
    source_revision: str | None = None,
) -> AdapterVersion:
    """Store a validated adapter under temporary keys and commit its `validating` version row
    (`base_model_name`: the base it was validated against; `source_uri`: where an import came from, without
    credentials or query string; `source_revision`: the commit a Hub import read).

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
            base_model_name=base_model_name,
            id=version_id,
            status="validating",
            config_blob_key=keys[CONFIG_FILENAME],
            weights_blob_key=keys[WEIGHTS_FILENAME],
            source_uri=source_uri,
            source_revision=source_revision,
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
    base_model_name: str,
    **fields: object,
) -> AdapterVersion:
    """Get or create the adapter (bound to `base_model_name`) and add its next version in one short write
    transaction (ConflictError when the adapter exists bound to another base model).

    The plan's adapter-count and stored-bytes quotas are checked in the same transaction, after locking the
    tenant's row (registry/upload_quota.py): concurrent uploads cannot pass a quota together.
    Concurrent uploads of one name can collide on the adapter row (uq_adapters_tenant_name_live) or the
    version number (uq_adapter_versions_adapter_number); the loser's transaction is rolled back and run
    again, when it finds the winner's rows.
    """
    repository.check_adapter_name(name, reserved=(base_model_name,))

    def insert(session: Session) -> AdapterVersion:
        quota = upload_quota.lock_tenant_quota(session, tenant_id)  # first: concurrent uploads count in turn
        model_names.check_adapter_name_free(session, name, is_locked=True)  # no model add meanwhile
        upload_quota.check_upload_quota(
            session,
            tenant_id,
            quota,
            is_new_adapter=repository.get_own_adapter(session, tenant_id, name) is None,
            num_bytes=int(fields["num_bytes"]),  # type: ignore[call-overload]  # known: imports are read first
        )
        adapter = repository.get_or_create_adapter(
            session, tenant_id, name, base_model_name=base_model_name, visibility=visibility
        )
        if adapter.base_model_name != base_model_name:  # created meanwhile by an upload for another base
            raise ConflictError(
                f"adapter {name!r} is bound to base model {adapter.base_model_name!r}, not {base_model_name!r}; "
                "upload this one under another name"
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
        "use_dora": info.use_dora,
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
    base_model: str | None = None,
    source_revision: str | None = None,
) -> AdapterVersion:
    """Steps 1-3 for files already on local disk: prepare, fully validate against the adapter's base model
    (`base_model`: the upload's choice, a name or alias; registry/base_model_choice.py), then stage
    (blocking)."""
    choices, bound = _read_bases(session, ctx, tenant_id, name)
    if visibility is not None:
        repository.check_visibility(visibility)
    check_incoming_names(names)
    num_bytes_left = upload_quota.precheck_quota(
        session, tenant_id, name, num_bytes=upload_quota.sent_weights_bytes(upload_dir, names)
    )
    adapter_dir = _prepare_within_quota(upload_dir, names, ctx.limits, num_bytes_left)
    chosen = choose_base_model(
        choices, requested=base_model, bound=bound, config_base=peek_config_base(adapter_dir)
    )
    info = validate_for_base(adapter_dir, chosen, choices, ctx.limits)
    return stage_upload(
        session,
        ctx,
        tenant_id=tenant_id,
        name=name,
        visibility=visibility,
        adapter_dir=adapter_dir,
        info=info,
        base_model_name=chosen.name,
        source_uri=source_uri,
        source_revision=source_revision,
    )


def _prepare_within_quota(
    upload_dir: Path, names: list[str], limits: ValidationLimits, num_bytes_left: int | None
) -> Path:
    """`prepare_adapter_dir` with an archive's weights bounded by what the plan's max_stored_bytes leaves (the
    member's declared size is checked before a byte is written, and extraction stops at the bound)."""
    if num_bytes_left is None or num_bytes_left >= limits.max_adapter_bytes:
        return prepare_adapter_dir(upload_dir, names, limits)
    try:
        return prepare_adapter_dir(upload_dir, names, replace(limits, max_adapter_bytes=num_bytes_left))
    except AdapterValidationError as exc:
        if not exc.code.endswith("too_large"):
            raise
        raise StorageQuotaError(
            f"this adapter's weights are larger than the {num_bytes_left} bytes your plan's max_stored_bytes "
            "leaves; delete adapters you no longer need, upload a smaller adapter, or ask the operator for a "
            "plan with more"
        ) from None


def _read_bases(
    session: Session, ctx: AdapterJobContext, tenant_id: str, name: str
) -> tuple[list[BaseModelChoice], str | None]:
    """The available base models and the base the tenant's adapter `name` is bound to (None for a new one),
    in a read ended before returning; refuses an adapter name that is a base model's."""
    try:
        choices = ctx.base_model_choices(session)
        repository.check_adapter_name(name, reserved=tuple(names_of(choices)))
        model_names.check_adapter_name_free(session, name)  # base-model names, removed ones included
        adapter = repository.get_own_adapter(session, tenant_id, name)
        return choices, adapter.base_model_name if adapter is not None else None
    finally:
        session.commit()
