"""Upload housekeeping: fail versions whose job was lost and delete the blobs no live version needs.

A process that dies mid-upload (kill -9, OOM, a lost node) can leave:
- staging blobs `uploads/<version id>/...` written before their `validating` row committed (no row), or of a
  row that has since been failed (`fail_stale_versions` deletes the blobs it knows of, but not ones it never
  saw);
- a `validating`/`uploading` row whose validation job died with it (`fail_stale_versions` fails it after
  settings.storage.stale_version_age_s and deletes its blobs);
- final blobs `adapters/<tenant>/<adapter>/<n>/...` copied by a validation job that died before it marked the
  row ready, or whose row was failed or rolled back;
- unfinished writes in the blob store (local `.tmp-*.part` files, S3 incomplete multipart uploads);
- its validation jobs' scratch directories (registry/job_scratch.py: removed once no live process holds them).

`select_orphaned_blobs` is the pure decision; `sweep_orphaned_blobs` and `run_upload_sweeps` are the thin I/O
around it. A blob younger than settings.storage.orphan_blob_min_age_s is never deleted: it may be being written right
now, before the row that will reference it commits. So the minimum age must exceed the longest time between a
blob's write and its row's commit (one upload's staging, one validation job's move).

Who runs them: `lorahost serve` once at start (after migrations) and then on an inline timer (api/main.py)
every settings.jobs.upload_sweep_interval_s; in cluster mode Celery beat (jobs/celery_app.py). Running them in
several places at once is harmless: deleting a blob twice is a no-op and failing a version is idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from registry.adapter_pipeline import AdapterJobContext
from registry.job_scratch import remove_abandoned_job_dirs
from registry.models import Adapter, AdapterVersion
from registry.storage import BlobStore
from registry.validation_job import fail_stale_versions

log = logging.getLogger(__name__)

STAGING_PREFIX = "uploads/"
FINAL_PREFIX = "adapters/"
IN_FLIGHT_STATUSES = frozenset({"uploading", "validating"})


@dataclass(frozen=True)
class VersionRef:
    """What the sweep needs to know of one version row."""

    id: str
    tenant_id: str
    adapter_id: str
    number: int
    status: str
    blob_keys: frozenset[str]  # the config and weights keys the row references (empty once failed)

    @property
    def is_in_flight(self) -> bool:
        """True while its validation job may still write or move blobs."""
        return self.status in IN_FLIGHT_STATUSES


@dataclass(frozen=True)
class BlobEntry:
    """One blob key and its last-modified time (timezone-aware)."""

    key: str
    modified_at: datetime


def select_orphaned_blobs(
    blobs: Iterable[BlobEntry], versions: Iterable[VersionRef], now: datetime, min_age_s: float
) -> list[str]:
    """The keys to delete: sweepable blobs no live version needs, older than `min_age_s` at `now`.

    Invariants: never a key a version row references, never a blob younger than `min_age_s`, never a key
    outside `uploads/` and `adapters/`, never a staging blob of an in-flight version, never a final blob at
    the place an in-flight version's job is moving its files to.
    """
    versions = list(versions)
    referenced = frozenset().union(*(v.blob_keys for v in versions))
    in_flight_ids = {v.id for v in versions if v.is_in_flight}
    in_flight_dirs = {_final_dir(v.tenant_id, v.adapter_id, v.number) for v in versions if v.is_in_flight}
    cutoff = now - timedelta(seconds=min_age_s)
    orphans = []
    for blob in blobs:
        if blob.modified_at >= cutoff or blob.key in referenced:
            continue
        if _is_unneeded(blob.key, in_flight_ids, in_flight_dirs):
            orphans.append(blob.key)
    return sorted(orphans)


def _is_unneeded(key: str, in_flight_ids: set[str], in_flight_dirs: set[str]) -> bool:
    """True for a staging blob of no in-flight version, or a final blob outside every in-flight job's target."""
    if key.startswith(STAGING_PREFIX):
        return key[len(STAGING_PREFIX) :].split("/", 1)[0] not in in_flight_ids
    if key.startswith(FINAL_PREFIX):
        return key.rsplit("/", 1)[0] not in in_flight_dirs
    return False  # outside the staging and final prefixes: not an upload blob, so it is kept


def _final_dir(tenant_id: str, adapter_id: str, number: int) -> str:
    """The folder of a version's final keys (registry.adapter_pipeline.final_keys without the file name)."""
    return f"{FINAL_PREFIX}{tenant_id}/{adapter_id}/{number}"


def load_version_refs(session: Session) -> list[VersionRef]:
    """Every version row (deleted adapters' too: their blobs stay until a purge removes the rows)."""
    rows = session.execute(
        select(AdapterVersion, Adapter.tenant_id).join(Adapter, Adapter.id == AdapterVersion.adapter_id)
    ).all()
    return [
        VersionRef(
            id=version.id,
            tenant_id=tenant_id,
            adapter_id=version.adapter_id,
            number=version.number,
            status=version.status,
            blob_keys=frozenset(k for k in (version.config_blob_key, version.weights_blob_key) if k),
        )
        for version, tenant_id in rows
    ]


def list_sweepable_blobs(store: BlobStore) -> list[BlobEntry]:
    """The blobs under `uploads/` and `adapters/` with their last-modified times."""
    return [
        BlobEntry(key, modified_at)
        for prefix in (STAGING_PREFIX, FINAL_PREFIX)
        for key, modified_at in store.list_keys_with_mtime(prefix)
    ]


def sweep_orphaned_blobs(
    session_factory: sessionmaker[Session], store: BlobStore, min_age_s: float, now: datetime | None = None
) -> list[str]:
    """Delete the orphaned blobs and abandoned partial writes older than `min_age_s`; returns what it removed."""
    now = now or datetime.now(UTC)
    blobs = list_sweepable_blobs(store)  # listed before the rows: a blob whose row commits later is young
    with session_factory() as session:
        versions = load_version_refs(session)
    orphans = select_orphaned_blobs(blobs, versions, now, min_age_s)
    for key in orphans:
        store.delete(key)
    cutoff = now - timedelta(seconds=min_age_s)
    partials = [k for p in (STAGING_PREFIX, FINAL_PREFIX) for k in store.delete_partial_writes(p, cutoff)]
    removed = orphans + partials
    if removed:
        log.warning("deleted %d orphaned upload blob(s): %s", len(removed), ", ".join(removed))
    return removed


@dataclass(frozen=True)
class SweepResult:
    """What one run of the upload sweeps did."""

    failed_version_ids: Sequence[str]
    deleted_blob_keys: Sequence[str]
    removed_job_dirs: Sequence[Path] = ()


def run_upload_sweeps(ctx: AdapterJobContext) -> SweepResult:
    """Fail stale versions (settings.storage.stale_version_age_s), then delete orphaned blobs
    (settings.storage.orphan_blob_min_age_s). In this order, so the blobs of a version just failed go too. Then
    remove the job scratch directories of this host that killed processes left."""
    settings = ctx.settings
    failed = fail_stale_versions(ctx, settings.storage.stale_version_age_s)
    if failed:
        log.warning(
            "failed %d stale adapter version(s) whose job was lost: %s", len(failed), ", ".join(failed)
        )
    deleted = sweep_orphaned_blobs(
        ctx.session_factory, ctx.blob_store, settings.storage.orphan_blob_min_age_s
    )
    removed_dirs = remove_abandoned_job_dirs()
    return SweepResult(failed_version_ids=failed, deleted_blob_keys=deleted, removed_job_dirs=removed_dirs)
