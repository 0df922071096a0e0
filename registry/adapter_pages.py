"""Pages of a tenant's adapters and of one adapter's versions (keyset pagination, registry/pages.py).

Orders (each unique, each served by an index):
- the tenant's own live adapters by name (a live name is unique per tenant: uq_adapters_tenant_name_live);
- with the public adapters of active tenants, by (name, created_at, id): the own rows and the public rows
  are read as two ordered index scans (ix_adapters_public_name) merged, never one scan filtered;
- an adapter's versions by number (uq_adapter_versions_adapter_number).

A cursor is the id of an adapter (a version) of the same list: the tenant's own adapter or a public adapter of an
active tenant, deleted since included (a walk goes on when the last row it read is deleted); any other id, a
private adapter of another tenant included, is the one InvalidCursorError.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, and_, exists, or_, select, union_all
from sqlalchemy.orm import Session, selectinload

from registry.models import Adapter, AdapterVersion, Tenant
from registry.pages import Page, PageRequest, after_key, anchor_key, read_page, split_page

OWN_KEYS = (Adapter.name,)
VISIBLE_KEYS = (Adapter.name, Adapter.created_at, Adapter.id)
VERSION_KEYS = (AdapterVersion.number,)


def is_live() -> Any:
    """Adapters not soft-deleted."""
    return Adapter.deleted_at.is_(None)


def is_active_owner(adapter: Any = Adapter) -> Any:
    """The adapter's owner is active (a disabled tenant's adapters are hidden from others): a correlated EXISTS,
    one primary-key probe per adapter row read, never a scan of every tenant."""
    return exists().where(Tenant.id == adapter.tenant_id, Tenant.is_active)


def is_public_of_active_other(tenant_id: str) -> Any:
    """Live public adapters of other tenants that are active."""
    return and_(is_live(), Adapter.visibility == "public", Adapter.tenant_id != tenant_id, is_active_owner())


def with_versions_and_owner(query: Select[Any]) -> Select[Any]:
    """Load each adapter's versions and owner with the page (two more queries, not one per adapter)."""
    return query.options(selectinload(Adapter.versions), selectinload(Adapter.tenant))


def own_adapter_page(session: Session, tenant_id: str, page: PageRequest) -> Page[Adapter]:
    """The tenant's live adapters by name, with their versions."""
    anchor = anchor_key(session, page, OWN_KEYS, Adapter.id, [Adapter.tenant_id == tenant_id])
    query = with_versions_and_owner(select(Adapter).where(Adapter.tenant_id == tenant_id, is_live()))
    return read_page(session, query, OWN_KEYS, anchor, page.limit)


def visible_adapter_page(session: Session, tenant_id: str, page: PageRequest) -> Page[Adapter]:
    """The tenant's live adapters and the public adapters of active tenants, by (name, created_at, id)."""
    # A cursor may have been deleted since its page was read (own or public), never made private or disabled.
    was_listed = and_(Adapter.visibility == "public", Adapter.tenant_id != tenant_id, is_active_owner())
    scope = or_(Adapter.tenant_id == tenant_id, was_listed)
    anchor = anchor_key(session, page, VISIBLE_KEYS, Adapter.id, [scope])
    own = and_(Adapter.tenant_id == tenant_id, is_live())
    ids = merged_ids(session, [own, is_public_of_active_other(tenant_id)], VISIBLE_KEYS, anchor, page.limit)
    return split_page(adapters_in_order(session, ids), page.limit)


def merged_ids(
    session: Session, branches: list[Any], keys: tuple[Any, ...], anchor: tuple[Any, ...] | None, limit: int
) -> list[str]:
    """The ids of the first limit + 1 adapters after `anchor` in `keys` order (unique) among the rows of any
    branch (the branches' rows are disjoint): each branch is read in order up to limit + 1 rows, then merged."""
    selected = {column.key: column for column in (Adapter.id, *keys)}.values()
    parts = []
    for where in branches:
        query = select(*selected).where(where)
        if anchor is not None:
            query = query.where(after_key(keys, anchor))
        parts.append(select(query.order_by(*keys).limit(limit + 1).subquery()))
    merged = union_all(*parts).subquery()
    columns = [merged.c[key.key] for key in keys]
    return list(session.scalars(select(merged.c.id).order_by(*columns).limit(limit + 1)))


def adapters_in_order(session: Session, ids: list[str]) -> list[Adapter]:
    """The adapters of `ids` in that order, with their versions and owners."""
    rows = session.scalars(with_versions_and_owner(select(Adapter).where(Adapter.id.in_(ids))))
    by_id = {adapter.id: adapter for adapter in rows}
    return [by_id[adapter_id] for adapter_id in ids]


def version_page(session: Session, adapter: Adapter, page: PageRequest) -> Page[AdapterVersion]:
    """The adapter's versions by number (the caller checked that the tenant may see the adapter)."""
    scope = [AdapterVersion.adapter_id == adapter.id]
    anchor = anchor_key(session, page, VERSION_KEYS, AdapterVersion.id, scope)
    return read_page(session, select(AdapterVersion).where(*scope), VERSION_KEYS, anchor, page.limit)
