"""Pages of a tenant's adapters and of an adapter's versions, on SQLite and PostgreSQL (each test rolled back)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.orm import Session

from registry import adapter_pages, repository
from registry.models import AdapterVersion, utcnow
from registry.pages import InvalidCursorError, PageRequest
from tests.registry.page_rows import add_adapter, add_tenant, at, walk


def _names(pages: list[list[object]]) -> list[str]:
    return [adapter.name for page in pages for adapter in page]  # type: ignore[attr-defined]


@pytest.mark.parametrize("limit", [1, 3, 100])
def test_walk_lists_every_own_adapter_once_by_name_with_rows_inserted_between_pages(
    db_session: Session, limit: int
) -> None:
    acme, bob = add_tenant(db_session, "acme"), add_tenant(db_session, "bob")
    names = [f"a-{i:02d}" for i in range(10)]
    for name in names:
        add_adapter(db_session, acme, name)
    add_adapter(db_session, bob, "a-055")  # another tenant's: never listed

    def between(index: int) -> None:
        if index == 0:  # one before the position (not listed: it is behind the reader) and one after it
            add_adapter(db_session, acme, "a")
            add_adapter(db_session, acme, "a-095")

    pages = walk(
        lambda page: adapter_pages.own_adapter_page(db_session, acme.id, page), limit, between=between
    )
    listed = _names(pages)
    expected = sorted([*names, "a-095"]) if limit < 10 else names
    assert listed == expected
    assert all(len(page) == limit for page in pages[:-1])


def test_a_deleted_own_adapter_still_works_as_the_cursor(db_session: Session) -> None:
    acme = add_tenant(db_session, "acme")
    adapters = [add_adapter(db_session, acme, f"a-{i}") for i in range(4)]
    first = adapter_pages.own_adapter_page(db_session, acme.id, PageRequest(limit=2))
    assert [a.name for a in first.items] == ["a-0", "a-1"] and first.has_more
    adapters[1].deleted_at = utcnow()
    adapters[2].deleted_at = utcnow()
    db_session.flush()
    rest = adapter_pages.own_adapter_page(db_session, acme.id, PageRequest(limit=2, after=adapters[1].id))
    assert [a.name for a in rest.items] == ["a-3"] and not rest.has_more


def test_a_walk_with_public_adapters_goes_on_when_its_cursor_is_deleted(db_session: Session) -> None:
    acme, bob = add_tenant(db_session, "acme"), add_tenant(db_session, "bob")
    for name in ("a", "c"):
        add_adapter(db_session, acme, name)
    for name in ("b", "d"):
        add_adapter(db_session, bob, name, visibility="public")

    def read(page: PageRequest) -> object:
        return adapter_pages.visible_adapter_page(db_session, acme.id, page)

    first = read(PageRequest(limit=2))
    assert [a.name for a in first.items] == ["a", "b"]  # type: ignore[attr-defined]
    first.items[-1].deleted_at = utcnow()  # type: ignore[attr-defined]
    db_session.flush()
    rest = read(PageRequest(limit=2, after=first.items[-1].id))  # type: ignore[attr-defined]
    assert [a.name for a in rest.items] == ["c", "d"]  # type: ignore[attr-defined]


def _cursor_message(read: object, after: str) -> str:
    with pytest.raises(InvalidCursorError) as caught:
        read(PageRequest(after=after))  # type: ignore[operator]
    return caught.value.message.replace(after, "<id>")


def test_another_tenants_adapter_is_the_same_invalid_cursor_as_an_unknown_id(db_session: Session) -> None:
    acme, bob = add_tenant(db_session, "acme"), add_tenant(db_session, "bob")
    add_adapter(db_session, acme, "mine")
    private = add_adapter(db_session, bob, "secret")
    public = add_adapter(db_session, bob, "shared", visibility="public")

    def own(page: PageRequest) -> object:
        return adapter_pages.own_adapter_page(db_session, acme.id, page)

    def visible(page: PageRequest) -> object:
        return adapter_pages.visible_adapter_page(db_session, acme.id, page)

    unknown = _cursor_message(own, str(uuid.uuid4()))
    assert "last_id of the previous page" in unknown
    assert _cursor_message(own, private.id) == unknown
    assert _cursor_message(own, public.id) == unknown  # not in the own list
    assert _cursor_message(visible, private.id) == unknown
    assert [a.name for a in visible(PageRequest(after=public.id)).items] == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("limit", [1, 2, 5])
def test_walk_with_public_adapters_lists_what_the_unpaged_list_does_in_the_same_order(
    db_session: Session, limit: int
) -> None:
    acme, bob, dave = (add_tenant(db_session, n) for n in ("acme", "bob", "dave"))
    carol = add_tenant(db_session, "carol", is_active=False)
    add_adapter(db_session, acme, "b", created_at=at(1))
    add_adapter(db_session, acme, "d", created_at=at(9))
    add_adapter(db_session, acme, "g", visibility="public", created_at=at(2))
    add_adapter(db_session, bob, "a", visibility="public", created_at=at(3))
    add_adapter(db_session, bob, "c", visibility="public", created_at=at(4))
    add_adapter(db_session, bob, "d", visibility="public", created_at=at(5))
    add_adapter(db_session, dave, "c", visibility="public", created_at=at(1))
    add_adapter(db_session, dave, "c2", visibility="public", created_at=at(1)).deleted_at = utcnow()
    add_adapter(db_session, carol, "e", visibility="public")  # a disabled tenant's: hidden
    add_adapter(db_session, bob, "f")  # private: hidden
    db_session.flush()

    pages = walk(lambda page: adapter_pages.visible_adapter_page(db_session, acme.id, page), limit)
    listed = [(a.name, a.tenant.name) for page in pages for a in page]
    unpaged = [(a.name, a.tenant.name) for a in repository.list_visible_adapters(db_session, acme.id)]
    assert listed == unpaged
    assert listed == [
        ("a", "bob"),
        ("b", "acme"),
        ("c", "dave"),
        ("c", "bob"),
        ("d", "bob"),
        ("d", "acme"),
        ("g", "acme"),
    ]


def test_versions_page_by_number_and_take_no_other_adapters_version_as_cursor(db_session: Session) -> None:
    acme = add_tenant(db_session, "acme")
    adapter = add_adapter(db_session, acme, "many", ("ready",) * 7)
    other = add_adapter(db_session, acme, "other", ("ready",))

    def between(index: int) -> None:
        if index == 0:
            db_session.add(AdapterVersion(adapter_id=adapter.id, number=8, status="validating"))
            db_session.flush()

    pages = walk(lambda page: adapter_pages.version_page(db_session, adapter, page), 3, between=between)
    assert [v.number for page in pages for v in page] == [1, 2, 3, 4, 5, 6, 7, 8]
    [other_version] = other.versions
    with pytest.raises(InvalidCursorError):
        adapter_pages.version_page(db_session, adapter, PageRequest(after=other_version.id))
