"""Rows for the list-page tests, written straight to the session (no upload pipeline), with chosen creation times,
and a walker that follows a list's cursor to its end."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from registry.models import Adapter, AdapterVersion, Tenant
from registry.pages import Page, PageRequest

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """A creation time `seconds` after T0."""
    return T0 + timedelta(seconds=seconds)


def add_tenant(session: Session, name: str, *, is_active: bool = True, created_at: datetime = T0) -> Tenant:
    """A tenant row."""
    tenant = Tenant(name=name, is_active=is_active, created_at=created_at)
    session.add(tenant)
    session.flush()
    return tenant


def add_adapter(
    session: Session,
    tenant: Tenant,
    name: str,
    statuses: tuple[str, ...] = ("ready",),
    *,
    visibility: str = "private",
    created_at: datetime = T0,
) -> Adapter:
    """An adapter row with one version per status (numbered 1..n)."""
    adapter = Adapter(
        tenant_id=tenant.id, name=name, visibility=visibility, base_model_name="base", created_at=created_at
    )
    session.add(adapter)
    session.flush()
    for number, status in enumerate(statuses, start=1):
        session.add(
            AdapterVersion(adapter_id=adapter.id, number=number, status=status, created_at=created_at)
        )
    session.flush()
    return adapter


def walk(
    read: Callable[[PageRequest], Page[Any]],
    limit: int,
    id_of: Callable[[Any], str] = lambda item: item.id,
    between: Callable[[int], None] = lambda _: None,
) -> list[list[Any]]:
    """Every page of a list, `limit` items each, following `after` = the last id of each page; `between(i)` runs
    after page i (to change the rows between pages)."""
    pages: list[list[Any]] = []
    after = None
    while True:
        page = read(PageRequest(limit=limit, after=after))
        assert len(page.items) <= limit
        pages.append(page.items)
        if not page.has_more:
            return pages
        assert page.items, "a page that says more follow has items"
        after = id_of(page.items[-1])
        between(len(pages) - 1)
