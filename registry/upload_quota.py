"""A tenant's upload quotas (from its price plan): live adapters and stored bytes.

What counts:
- adapters: the tenant's live (not soft-deleted) adapters. A new version of an existing adapter adds no
  adapter; versions are bounded by the bytes quota and the upload rate (api/upload_rate.py).
- stored bytes: `num_bytes` (the size of adapter_model.safetensors) of every version of a live adapter that
  is uploading, validating or ready. Failed versions and deleted adapters free their bytes. adapter_config.json
  (at most 1 MiB) is not counted. An import is read during its request (registry/import_sources.py), so its
  bytes are known, and checked like an upload's, when its version row is inserted.

Race-free: the checks run inside the write transaction that inserts the version row, after locking the
tenant's row (PostgreSQL: SELECT ... FOR UPDATE; SQLite: the write transaction already excludes other
writers), so concurrent uploads of one tenant are counted one after another and cannot pass a quota together.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry import repository
from registry.errors import AdapterQuotaError, StorageQuotaError
from registry.models import Adapter, AdapterVersion, PricePlan, Tenant
from registry.validation import WEIGHTS_FILENAME

STORED_STATUSES = ("uploading", "validating", "ready")


@dataclass(frozen=True)
class UploadQuota:
    """A plan's upload quotas; None = unlimited (a tenant without a plan has no quota)."""

    plan_name: str = ""
    max_uploads_per_min: int | None = None
    max_adapters: int | None = None
    max_stored_bytes: int | None = None


def read_quota(session: Session, tenant_id: str) -> UploadQuota:
    """The quotas of the tenant's plan, read from the database (not from objects the session holds)."""
    stmt = (
        select(PricePlan.name, PricePlan.uploads_per_min, PricePlan.max_adapters, PricePlan.max_stored_bytes)
        .join_from(Tenant, PricePlan, Tenant.plan_id == PricePlan.id)
        .where(Tenant.id == tenant_id)
    )
    row = session.execute(stmt).first()
    return UploadQuota(*row) if row is not None else UploadQuota()


def lock_tenant_quota(session: Session, tenant_id: str) -> UploadQuota:
    """Lock the tenant's row until the transaction ends and return its plan's quotas.

    Call first in the write transaction that inserts or readies a version, before counting.
    """
    # FOR NO KEY UPDATE (PostgreSQL): excludes other quota checks of this tenant, not the inserts of rows
    # that reference the tenant (usage records take FOR KEY SHARE on it).
    session.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update(key_share=True))
    return read_quota(session, tenant_id)


def num_live_adapters(session: Session, tenant_id: str) -> int:
    """The tenant's adapters that are not soft-deleted."""
    stmt = select(func.count(Adapter.id)).where(Adapter.tenant_id == tenant_id, Adapter.deleted_at.is_(None))
    return int(session.scalar(stmt) or 0)


def num_stored_bytes(session: Session, tenant_id: str) -> int:
    """Bytes the tenant's live adapters hold: weights of every uploading, validating or ready version."""
    stmt = (
        select(func.coalesce(func.sum(AdapterVersion.num_bytes), 0))
        .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
        .where(
            Adapter.tenant_id == tenant_id,
            Adapter.deleted_at.is_(None),
            AdapterVersion.status.in_(STORED_STATUSES),
        )
    )
    return int(session.scalar(stmt) or 0)


def check_adapter_count(
    session: Session, tenant_id: str, quota: UploadQuota, *, is_new_adapter: bool
) -> None:
    """AdapterQuotaError when a new adapter would pass max_adapters."""
    if quota.max_adapters is None or not is_new_adapter:
        return
    num_adapters = num_live_adapters(session, tenant_id)
    if num_adapters + 1 > quota.max_adapters:
        raise AdapterQuotaError(
            f"plan {quota.plan_name!r} allows at most {quota.max_adapters} adapters (max_adapters) and you have "
            f"{num_adapters}; delete an adapter (DELETE /v1/adapters/<name>), upload this one as a new version "
            "of an existing adapter, or ask the operator for a plan with more"
        )


def check_stored_bytes(session: Session, tenant_id: str, quota: UploadQuota, num_bytes: int) -> None:
    """StorageQuotaError when `num_bytes` more would pass max_stored_bytes."""
    if quota.max_stored_bytes is None:
        return
    stored = num_stored_bytes(session, tenant_id)
    if stored + num_bytes > quota.max_stored_bytes:
        raise StorageQuotaError(
            f"plan {quota.plan_name!r} allows at most {quota.max_stored_bytes} stored bytes (max_stored_bytes); "
            f"you store {stored} and this adapter needs {num_bytes}; delete adapters you no longer need, upload "
            "a smaller adapter (lower rank, fewer target modules, fp16/bf16), or ask the operator for a plan "
            "with more"
        )


def check_upload_quota(
    session: Session, tenant_id: str, quota: UploadQuota, *, is_new_adapter: bool, num_bytes: int
) -> None:
    """Both checks for one upload (adapter count first)."""
    check_adapter_count(session, tenant_id, quota, is_new_adapter=is_new_adapter)
    check_stored_bytes(session, tenant_id, quota, num_bytes)


def precheck_quota(session: Session, tenant_id: str, name: str, *, num_bytes: int) -> int | None:
    """Refuse early (before extracting and validating) an upload the plan's quotas have no room for; returns
    the stored bytes the plan leaves after it (None: no limit), which bounds an archive's extraction.

    A read only, ended before returning; the version row's write transaction checks again (the authoritative
    check: uploads running meanwhile may have used the room).
    """
    try:
        quota = read_quota(session, tenant_id)
        is_new_adapter = repository.get_own_adapter(session, tenant_id, name) is None
        check_upload_quota(session, tenant_id, quota, is_new_adapter=is_new_adapter, num_bytes=num_bytes)
        if quota.max_stored_bytes is None:
            return None
        return max(0, quota.max_stored_bytes - num_stored_bytes(session, tenant_id))
    finally:
        session.commit()  # end the read: staging starts a write transaction of its own


def sent_weights_bytes(upload_dir: Path, names: list[str]) -> int:
    """Size of adapter_model.safetensors when sent as is (0 for an archive: known once extracted)."""
    return (upload_dir / WEIGHTS_FILENAME).stat().st_size if WEIGHTS_FILENAME in names else 0
