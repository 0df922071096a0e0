"""Pages of GET /v1/models: the base models first, by name, then the adapters the tenant can call by name, by
name. The list's ids are model names, unique across it, so the cursor (`after`, the last id of the previous
page) is a position by name, and it keeps working when that model is removed between pages:
- a base model's name (one served now, or one the catalog ever held: base_model_names keeps removed models'
  names, and no adapter can take them) continues among the base models, then all adapters;
- any other adapter-shaped name continues among the adapters after it; a name of another shape is an
  InvalidCursorError. A name says nothing about other tenants: the page lists only what this tenant may call.

Each name appears once, as the adapter `model=<name>` resolves to (registry/repository.py
find_visible_adapter): the tenant's own live adapter of that name, else the oldest public live adapter of an
active tenant; it is listed when that adapter has a ready version, with its latest ready version. The own and
the public adapters are read as two ordered index scans (uq_adapters_tenant_name_live, ix_adapters_public_name)
merged; ready versions through ix_adapter_versions_ready.

The admin's catalog (GET /v1/admin/models, `catalog_model_page`) pages the same way: live base models by name,
a cursor being any name the catalog ever held.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, select, tuple_
from sqlalchemy.orm import Session, aliased, selectinload

from registry.adapter_pages import is_active_owner, is_live, is_public_of_active_other, merged_ids
from registry.models import Adapter, AdapterVersion, BaseModelName, CatalogModel
from registry.pages import Page, PageRequest, invalid_cursor, read_page
from registry.repository import ADAPTER_NAME_RE

NAME_KEYS = (Adapter.name,)
CATALOG_KEYS = (CatalogModel.name,)


@dataclass(frozen=True)
class ModelPage:
    """One page of models: base model names, then adapters with their latest ready version."""

    base_names: list[str]
    adapters: list[tuple[Adapter, AdapterVersion]]
    has_more: bool


def model_page(session: Session, tenant_id: str, base_names: Iterable[str], page: PageRequest) -> ModelPage:
    """The page of base models (`base_names`: those served now) and callable adapters after `page.after`."""
    names = sorted(set(base_names))
    adapter_after: str | None = None
    if page.after is None or is_base_position(session, page.after, names):
        shown = [name for name in names if page.after is None or name > page.after]
    elif ADAPTER_NAME_RE.fullmatch(page.after):
        shown, adapter_after = [], page.after
    else:
        raise invalid_cursor(page.after)
    if len(shown) > page.limit:
        return ModelPage(shown[: page.limit], [], has_more=True)
    ids = callable_adapter_ids(session, tenant_id, adapter_after, page.limit - len(shown), names)
    num_adapters = page.limit - len(shown)
    return ModelPage(shown, with_latest_ready(session, ids[:num_adapters]), has_more=len(ids) > num_adapters)


def is_base_position(session: Session, after: str, names: list[str]) -> bool:
    """True when `after` is a base model's name: served now, or ever held by the catalog."""
    return after in names or session.get(BaseModelName, after.lower()) is not None


def callable_adapter_ids(
    session: Session, tenant_id: str, after: str | None, limit: int, base_names: list[str]
) -> list[str]:
    """The ids of the first limit + 1 adapters after the name `after` that the tenant calls by their name."""
    anchor = None if after is None else (after,)
    own = and_(Adapter.tenant_id == tenant_id, is_live(), has_ready_version())
    public = and_(
        is_public_of_active_other(tenant_id),
        ~exists().where(_same_name_own(tenant_id)),
        ~exists().where(_same_name_older_public(tenant_id)),
        has_ready_version(),
    )
    not_base = Adapter.name.not_in(base_names)  # a base model's name resolves to the base model
    return merged_ids(session, [and_(own, not_base), and_(public, not_base)], NAME_KEYS, anchor, limit)


def has_ready_version() -> Any:
    """The adapter has a ready version."""
    ready = AdapterVersion.status == "ready"
    return exists().where(AdapterVersion.adapter_id == Adapter.id, ready)


def _same_name_own(tenant_id: str) -> Any:
    """The tenant has a live adapter of the outer adapter's name (its own shadows every public one)."""
    own = aliased(Adapter)
    return and_(own.tenant_id == tenant_id, own.name == Adapter.name, own.deleted_at.is_(None))


def _same_name_older_public(tenant_id: str) -> Any:
    """An older public live adapter of an active tenant has the outer adapter's name (the oldest wins)."""
    other = aliased(Adapter)
    is_older = tuple_(other.created_at, other.id) < tuple_(Adapter.created_at, Adapter.id)
    return and_(
        other.name == Adapter.name,
        other.visibility == "public",
        other.deleted_at.is_(None),
        other.tenant_id != tenant_id,
        is_active_owner(other),
        is_older,
    )


def with_latest_ready(session: Session, ids: list[str]) -> list[tuple[Adapter, AdapterVersion]]:
    """The adapters of `ids`, in that order, each with its latest ready version (one query for all)."""
    if not ids:
        return []
    latest = (
        select(AdapterVersion.adapter_id, func.max(AdapterVersion.number).label("number"))
        .where(AdapterVersion.adapter_id.in_(ids), AdapterVersion.status == "ready")
        .group_by(AdapterVersion.adapter_id)
        .subquery()
    )
    on_latest = and_(
        AdapterVersion.adapter_id == latest.c.adapter_id, AdapterVersion.number == latest.c.number
    )
    versions = {v.adapter_id: v for v in session.scalars(select(AdapterVersion).join(latest, on_latest))}
    query = select(Adapter).where(Adapter.id.in_(ids)).options(selectinload(Adapter.tenant))
    adapters = {a.id: a for a in session.scalars(query)}
    return [(adapters[i], versions[i]) for i in ids]


def catalog_model_page(session: Session, page: PageRequest) -> Page[CatalogModel]:
    """The catalog's live base models by name (GET /v1/admin/models), after the model named `page.after`.
    The list's ids are names, so a cursor is a position by name and keeps working when that model is removed
    between pages; a name the catalog never held is an InvalidCursorError."""
    if page.after is not None and session.get(BaseModelName, page.after.lower()) is None:
        raise invalid_cursor(page.after)
    query = select(CatalogModel).where(CatalogModel.status == "ready")
    anchor = None if page.after is None else (page.after,)
    return read_page(session, query, CATALOG_KEYS, anchor, page.limit)
