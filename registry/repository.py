"""Queries over the registry tables. Every tenant-scoped function takes `tenant_id`.

Functions flush but never commit: the caller (route, job) owns the transaction.
A tenant sees its own adapters and the public adapters of active tenants; another tenant's private adapter
(or a disabled tenant's public one) is reported as not found, never as forbidden.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session, selectinload

from registry.errors import ConflictError, InvalidRequestError, NotFoundError, PermissionDeniedError
from registry.models import (
    MAX_INTEGER_COLUMN,
    VISIBILITIES,
    Adapter,
    AdapterVersion,
    PricePlan,
    Tenant,
    utcnow,
)

ADAPTER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
ADAPTER_NAME_RULE = (
    "adapter names are 1-64 characters of lowercase letters, digits, '-', '_' or '.', "
    "starting with a letter or digit"
)
VERSION_RE = re.compile(r"[0-9]{1,10}")  # re's \d and str.isdigit accept every script's digits
PREFIX_CACHE_NAMESPACE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
PREFIX_CACHE_NAMESPACE_RULE = (
    "a shared prefix-cache namespace is 1-64 characters of lowercase letters, digits, '-', '_' or '.', "
    "starting with a letter or digit (or null: the tenant's own namespace)"
)
UNSET: Any = object()


# ---- tenants, plans and keys -------------------------------------------------------------------


def create_price_plan(session: Session, name: str, **fields: Any) -> PricePlan:
    """Insert a price plan (prices per 1M tokens, storage per adapter-day, limits, SLO targets); ConflictError
    when a plan of that name exists (a concurrent insert of the name fails on the unique constraint instead)."""
    if session.scalar(select(PricePlan.id).where(PricePlan.name == name)) is not None:
        raise ConflictError(
            f"a price plan named {name!r} exists already: choose another name", code="plan_exists"
        )
    plan = PricePlan(name=name, **fields)
    session.add(plan)
    session.flush()
    return plan


def get_price_plan(session: Session, plan_id: str) -> PricePlan:
    """The plan with this id, or NotFoundError."""
    plan = session.get(PricePlan, plan_id)
    if plan is None:
        raise NotFoundError(f"price plan {plan_id!r} does not exist")
    return plan


def list_price_plans(session: Session) -> list[PricePlan]:
    """All price plans, by name."""
    return list(session.scalars(select(PricePlan).order_by(PricePlan.name)))


def check_prefix_cache_namespace(namespace: str | None) -> str | None:
    """Return `namespace` if it is None or a valid shared namespace name, else InvalidRequestError saying the
    rule."""
    if namespace is not None and not PREFIX_CACHE_NAMESPACE_RE.fullmatch(namespace):
        raise InvalidRequestError(
            f"invalid prefix_cache_namespace {namespace[:80]!r}: {PREFIX_CACHE_NAMESPACE_RULE}",
            code="invalid_prefix_cache_namespace",
        )
    return namespace


def create_tenant(
    session: Session, name: str, plan_id: str | None = None, prefix_cache_namespace: str | None = None
) -> Tenant:
    """Insert an active tenant (`prefix_cache_namespace`: a shared prefix-cache namespace, None: its own)."""
    check_prefix_cache_namespace(prefix_cache_namespace)
    if plan_id is not None:
        get_price_plan(session, plan_id)
    tenant = Tenant(name=name, plan_id=plan_id, is_active=True, prefix_cache_namespace=prefix_cache_namespace)
    session.add(tenant)
    session.flush()
    return tenant


def list_tenants(session: Session) -> list[Tenant]:
    """All tenants, oldest first."""
    return list(session.scalars(select(Tenant).order_by(Tenant.created_at, Tenant.id)))


def get_tenant(session: Session, tenant_id: str) -> Tenant:
    """The tenant with this id, or NotFoundError."""
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFoundError(f"tenant {tenant_id!r} does not exist")
    return tenant


def update_tenant(
    session: Session,
    tenant_id: str,
    *,
    is_active: bool | None = None,
    plan_id: str | None = UNSET,
    prefix_cache_namespace: str | None = UNSET,
    can_manage_keys: bool | None = None,
) -> Tenant:
    """Enable/disable a tenant, change its plan (plan_id=None clears it), its shared prefix-cache
    namespace (None: back to its own) and/or whether it may manage its own API keys."""
    if prefix_cache_namespace is not UNSET:
        check_prefix_cache_namespace(prefix_cache_namespace)
    tenant = get_tenant(session, tenant_id)
    if is_active is not None:
        tenant.is_active = is_active
    if plan_id is not UNSET:
        if plan_id is not None:
            get_price_plan(session, plan_id)
        tenant.plan_id = plan_id
    if prefix_cache_namespace is not UNSET:
        tenant.prefix_cache_namespace = prefix_cache_namespace
    if can_manage_keys is not None:
        tenant.can_manage_keys = can_manage_keys
    session.flush()
    return tenant


# ---- adapter names -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRef:
    """A parsed `name` or `name@3` reference."""

    name: str
    version: int | None = None


def check_adapter_name(name: str, *, reserved: tuple[str, ...] = ()) -> str:
    """Return `name` if it is a valid adapter slug, else InvalidRequestError saying the rule."""
    if not ADAPTER_NAME_RE.fullmatch(name or ""):
        raise InvalidRequestError(f"invalid adapter name {name!r}: {ADAPTER_NAME_RULE}", code="invalid_name")
    if name in reserved:
        raise InvalidRequestError(f"adapter name {name!r} is reserved; choose another", code="invalid_name")
    return name


def parse_model_ref(ref: str) -> ModelRef:
    """Parse `name` or `name@N`, N in ASCII digits 0-9 only (str.isdigit also takes '١' or '²') and in
    [1, MAX_INTEGER_COLUMN] (the column's range: a longer number can name no version)."""
    name, sep, version = ref.partition("@")
    if not sep:
        return ModelRef(name=name)
    if not VERSION_RE.fullmatch(version) or not 1 <= int(version) <= MAX_INTEGER_COLUMN:
        raise InvalidRequestError(
            f"invalid version in {ref!r}: use name@N with N a positive integer in ASCII digits 0-9, "
            f"at most {MAX_INTEGER_COLUMN}",
            code="invalid_name",
        )
    return ModelRef(name=name, version=int(version))


def check_visibility(visibility: str) -> str:
    """Return `visibility` if allowed, else InvalidRequestError."""
    if visibility not in VISIBILITIES:
        raise InvalidRequestError(
            f"visibility must be one of {', '.join(VISIBILITIES)}, got {visibility!r}",
            code="invalid_visibility",
        )
    return visibility


# ---- adapters and versions ---------------------------------------------------------------------


def _live_adapters(*, with_versions: bool = True) -> Any:
    """Live adapters with their owner and (with_versions) every version loaded."""
    loads = [selectinload(Adapter.tenant)]
    if with_versions:
        loads.append(selectinload(Adapter.versions))
    return select(Adapter).where(Adapter.deleted_at.is_(None)).options(*loads)


def get_own_adapter(
    session: Session, tenant_id: str, name: str, *, with_versions: bool = True
) -> Adapter | None:
    """The tenant's live adapter with this name, or None."""
    stmt = _live_adapters(with_versions=with_versions).where(
        Adapter.tenant_id == tenant_id, Adapter.name == name
    )
    return session.scalars(stmt).first()


def _is_public_of_active_owner() -> Any:
    """Public adapters whose owner is active: a disabled tenant's adapters are hidden from everyone else."""
    is_active_owner = Adapter.tenant_id.in_(select(Tenant.id).where(Tenant.is_active))
    return and_(Adapter.visibility == "public", is_active_owner)


def find_visible_adapter(
    session: Session, tenant_id: str, name: str, *, with_versions: bool = True
) -> Adapter:
    """The tenant's own adapter with this name, else the oldest public one of an active tenant;
    NotFoundError otherwise. with_versions=False leaves the versions to be read page by page."""
    own = get_own_adapter(session, tenant_id, name, with_versions=with_versions)
    if own is not None:
        return own
    stmt = (
        _live_adapters(with_versions=with_versions)
        .where(Adapter.name == name, _is_public_of_active_owner())
        .order_by(Adapter.created_at, Adapter.id)
    )
    public = session.scalars(stmt).first()
    if public is None:
        raise NotFoundError(f"adapter {name!r} not found", code="adapter_not_found")
    return public


def list_own_adapters(session: Session, tenant_id: str) -> list[Adapter]:
    """The tenant's live adapters, by name."""
    stmt = _live_adapters().where(Adapter.tenant_id == tenant_id).order_by(Adapter.name)
    return list(session.scalars(stmt))


def list_visible_adapters(session: Session, tenant_id: str) -> list[Adapter]:
    """The tenant's own live adapters plus every public live adapter of an active tenant, by name."""
    stmt = (
        _live_adapters()
        .where(or_(Adapter.tenant_id == tenant_id, _is_public_of_active_owner()))
        .order_by(Adapter.name, Adapter.created_at)
    )
    return list(session.scalars(stmt))


def get_or_create_adapter(
    session: Session, tenant_id: str, name: str, *, base_model_name: str, visibility: str | None = None
) -> Adapter:
    """The tenant's live adapter `name` (visibility updated if given), created when missing."""
    adapter = get_own_adapter(session, tenant_id, name)
    if adapter is None:
        adapter = Adapter(
            tenant_id=tenant_id,
            name=name,
            visibility=check_visibility(visibility or "private"),
            base_model_name=base_model_name,
        )
        session.add(adapter)
    elif visibility is not None:
        adapter.visibility = check_visibility(visibility)
    session.flush()
    return adapter


def add_adapter_version(session: Session, tenant_id: str, adapter: Adapter, **fields: Any) -> AdapterVersion:
    """Insert version N+1 of the tenant's adapter (status and blob keys in `fields`).

    The adapter row is locked first (PostgreSQL: SELECT ... FOR UPDATE; SQLite's write transaction already
    excludes other writers), so concurrent uploads of one name take numbers one after another; the unique
    constraint uq_adapter_versions_adapter_number still guards the number.
    """
    if adapter.tenant_id != tenant_id:
        raise NotFoundError(f"adapter {adapter.name!r} not found", code="adapter_not_found")
    if not lock_live_adapter(session, adapter.id):
        raise NotFoundError(
            f"adapter {adapter.name!r} was deleted while this upload was stored; upload it again",
            code="adapter_not_found",
        )
    current = session.scalar(
        select(func.max(AdapterVersion.number)).where(AdapterVersion.adapter_id == adapter.id)
    )
    version = AdapterVersion(adapter_id=adapter.id, number=(current or 0) + 1, **fields)
    session.add(version)
    session.flush()
    return version


def lock_live_adapter(session: Session, adapter_id: str) -> bool:
    """Lock the adapter's row until the transaction ends; False when it is gone or soft-deleted.

    PostgreSQL: SELECT ... FOR UPDATE. SQLite has no row locks: its write transaction excludes other writers.
    """
    stmt = select(Adapter.id).where(Adapter.id == adapter_id, Adapter.deleted_at.is_(None)).with_for_update()
    return session.scalar(stmt) is not None


def soft_delete_adapter(session: Session, tenant_id: str, name: str) -> Adapter:
    """Soft-delete the tenant's adapter. Another tenant's private adapter is NotFound, a public one Denied."""
    adapter = get_own_adapter(session, tenant_id, name)
    if adapter is None:
        other = find_visible_adapter(session, tenant_id, name)  # raises NotFound for private ones
        raise PermissionDeniedError(
            f"adapter {other.name!r} belongs to another tenant; you can only delete your own adapters"
        )
    adapter.deleted_at = utcnow()
    session.flush()
    return adapter


def pick_version(adapter: Adapter, version: int | None, *, is_ready_only: bool = True) -> AdapterVersion:
    """The pinned version `number`, or the latest ready one; NotFoundError saying why otherwise."""
    if version is not None:
        for candidate in adapter.versions:
            if candidate.number == version:
                if is_ready_only and candidate.status != "ready":
                    raise NotFoundError(
                        f"version {adapter.name}@{version} is {candidate.status}, not ready",
                        code="adapter_not_ready",
                    )
                return candidate
        raise NotFoundError(f"adapter {adapter.name}@{version} not found", code="adapter_not_found")
    ready = [v for v in adapter.versions if v.status == "ready"]
    if not ready:
        raise NotFoundError(f"adapter {adapter.name!r} has no ready version yet", code="adapter_not_ready")
    return max(ready, key=lambda v: v.number)


def resolve_model(session: Session, tenant_id: str, ref: str) -> tuple[Adapter, AdapterVersion]:
    """Resolve `name` / `name@N` to a visible adapter and its ready version (for inference)."""
    parsed = parse_model_ref(ref)
    adapter = find_visible_adapter(session, tenant_id, parsed.name)
    return adapter, pick_version(adapter, parsed.version)


def list_ready_models(session: Session, tenant_id: str) -> list[tuple[Adapter, AdapterVersion]]:
    """Visible adapters that have a ready version, each with its latest ready version."""
    out = []
    for adapter in list_visible_adapters(session, tenant_id):
        ready = [v for v in adapter.versions if v.status == "ready"]
        if ready:
            out.append((adapter, max(ready, key=lambda v: v.number)))
    return out


def get_version(session: Session, version_id: str) -> AdapterVersion:
    """A version by id (internal: jobs), or NotFoundError."""
    version = session.get(AdapterVersion, version_id)
    if version is None:
        raise NotFoundError(f"adapter version {version_id!r} does not exist")
    return version


def count_rows(session: Session, model: type) -> int:
    """Number of rows in a table (tests and admin stats)."""
    return int(session.scalar(select(func.count()).select_from(model)) or 0)


def version_labels(session: Session, version_ids: Iterable[str]) -> dict[str, str]:
    """Operator-facing labels `tenant/adapter@N` of adapter version ids (unknown ids are left out)."""
    ids = set(version_ids)
    if not ids:
        return {}
    query = (
        select(AdapterVersion.id, Tenant.name, Adapter.name, AdapterVersion.number)
        .join(Adapter, AdapterVersion.adapter_id == Adapter.id)
        .join(Tenant, Adapter.tenant_id == Tenant.id)
        .where(AdapterVersion.id.in_(ids))
    )
    return {vid: f"{tenant}/{adapter}@{number}" for vid, tenant, adapter, number in session.execute(query)}
