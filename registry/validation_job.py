"""Step 4 of the adapter upload pipeline (registry/adapter_pipeline.py has steps 1-3 and the shared context):
the validation job a job runner (inline or Celery) calls with a version id, and the sweep of versions whose job
was lost.

`run_validation_job`: download, verify both files' sha256, re-validate, copy blobs to
`adapters/<tenant>/<adapter>/<version>/`, mark `ready`, then delete the staging blobs; or mark `failed` with
the reason and delete every blob of that version. Imports reach this step like uploads: their source was read at
request time (registry/import_sources.py), so this job never reads a location a tenant chose.
Invariant (as for the whole pipeline): each version row's blobs exist and each blob belongs to a row; no
transaction is held open across file or network I/O.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import repository
from registry.adapter_pipeline import (
    FINAL_STATUSES,
    IN_FLIGHT_STATUSES,
    AdapterJobContext,
    delete_keys,
    file_digests,
    final_keys,
    info_fields,
    validate_adapter_files,
)
from registry.db import run_in_write_transaction
from registry.digests import sha256_file
from registry.job_scratch import job_scratch_dir
from registry.models import AdapterVersion, utcnow
from registry.validation import CONFIG_FILENAME, WEIGHTS_FILENAME, AdapterInfo, AdapterValidationError

log = logging.getLogger(__name__)

# ---- step 4: the validation job ----------------------------------------------------------------


@dataclass(frozen=True)
class StagedVersion:
    """What the validation job needs to know of a version, read in a short transaction of its own."""

    id: str
    status: str
    tenant_id: str
    adapter_id: str
    base_model_name: str
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
        delete_keys(ctx.blob_store, dest.values())
    delete_keys(ctx.blob_store, staged.blob_keys)
    return status


def _load_staged(ctx: AdapterJobContext, version_id: str) -> StagedVersion:
    with ctx.session_factory() as session:
        version = repository.get_version(session, version_id)
        return StagedVersion(
            id=version.id,
            status=version.status,
            tenant_id=version.adapter.tenant_id,
            adapter_id=version.adapter_id,
            base_model_name=version.adapter.base_model_name,
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
        for key, value in {**digests, **info_fields(info)}.items():
            setattr(version, key, value)
        return "ready"

    with ctx.session_factory() as session:
        return run_in_write_transaction(session, update)


def _fetch_and_validate(
    ctx: AdapterJobContext, staged: StagedVersion, dest: dict[str, str]
) -> tuple[AdapterInfo, dict[str, str]]:
    """Bring the files to a temp dir, verify and re-validate them, then put them at their final keys."""
    with job_scratch_dir() as work:
        if not staged.weights_blob_key:
            raise AdapterValidationError(
                "import_again",
                "this import was queued by an earlier lorahost, which read s3:// sources with the platform's "
                "credentials; import it again (a presigned https URL, or s3:// with your own credentials)",
            )
        adapter_dir = _fetch_staged(ctx, staged, work)
        info, _ = validate_adapter_files(adapter_dir, ctx, staged.base_model_name)
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
        delete_keys(ctx.blob_store, dest.values())
        raise
    if status != "ready":  # a concurrent run of this job that succeeded owns the final blobs
        delete_keys(ctx.blob_store, dest.values())
    delete_keys(ctx.blob_store, staged.blob_keys)
    return status


def _failure_reason(version_id: str, exc: Exception) -> str:
    if isinstance(exc, AdapterValidationError):
        return f"{exc.code}: {exc.message}"
    log.error("validation job for version %s failed", version_id, exc_info=exc)
    # the exception's text stays in the log: it may name internal hosts, buckets or keys
    return f"internal error while validating ({type(exc).__name__}); upload again or contact support"


def _set_failed(version: AdapterVersion, reason: str) -> None:
    version.status = "failed"
    version.failure_reason = reason
    version.config_blob_key = None
    version.weights_blob_key = None
    version.finished_at = utcnow()


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
        delete_keys(ctx.blob_store, keys)
    return [version_id for version_id, _ in failed]
