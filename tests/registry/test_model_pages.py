"""Pages of GET /v1/models (base models, then the adapters a tenant calls by name), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from registry import repository
from registry.model_pages import ModelPage, model_page
from registry.models import BaseModelName, CatalogModel, Tenant, utcnow
from registry.pages import InvalidCursorError, Page, PageRequest
from tests.registry.page_rows import add_adapter, add_tenant, at, walk

BASE_NAMES = ("m-base", "n-base")


def _seed(session: Session) -> Tenant:
    """acme's callable models: a1 (own, v2 latest ready), c1 (own), d1 (dave's, the oldest public d1)."""
    acme, bob, dave = (add_tenant(session, n) for n in ("acme", "bob", "dave"))
    carol = add_tenant(session, "carol", is_active=False)
    add_adapter(session, acme, "a1", ("ready", "ready", "failed"))
    add_adapter(session, acme, "b1", ("failed",))  # own, never ready: shadows bob's public b1
    add_adapter(session, bob, "b1", visibility="public")
    add_adapter(session, acme, "c1")
    add_adapter(session, bob, "d1", visibility="public", created_at=at(5))
    add_adapter(session, dave, "d1", visibility="public", created_at=at(1))  # the oldest public d1 wins
    add_adapter(session, carol, "e1", visibility="public")  # a disabled tenant's: hidden
    add_adapter(session, bob, "f1", ("uploading",), visibility="public")  # nothing ready
    add_adapter(session, dave, "g1", ("validating",), visibility="public", created_at=at(1))
    add_adapter(session, bob, "g1", visibility="public", created_at=at(2))  # g1 resolves to dave's: not ready
    add_adapter(session, bob, "h1")  # private
    return acme


def _ids(page: ModelPage) -> list[str]:
    return page.base_names + [f"{adapter.name}@{version.number}" for adapter, version in page.adapters]


def _as_page(page: ModelPage) -> Page[str]:
    return Page(_ids(page), page.has_more)


@pytest.mark.parametrize("limit", [1, 2, 3, 100])
def test_walk_lists_base_models_then_each_callable_name_once(db_session: Session, limit: int) -> None:
    acme = _seed(db_session)
    pages = walk(
        lambda page: _as_page(model_page(db_session, acme.id, BASE_NAMES, page)),
        limit,
        id_of=lambda model_id: model_id.split("@")[0],
    )
    assert [m for page in pages for m in page] == ["m-base", "n-base", "a1@2", "c1@1", "d1@1"]


def test_each_listed_adapter_is_the_one_its_name_resolves_to(db_session: Session) -> None:
    acme = _seed(db_session)
    page = model_page(db_session, acme.id, BASE_NAMES, PageRequest())
    for adapter, version in page.adapters:
        assert repository.resolve_model(db_session, acme.id, adapter.name) == (adapter, version)
    assert page.adapters[-1][0].tenant.name == "dave"


def test_a_name_cursor_is_a_position_even_when_its_model_is_gone(db_session: Session) -> None:
    acme = _seed(db_session)

    def after(cursor: str) -> list[str]:
        return _ids(model_page(db_session, acme.id, BASE_NAMES, PageRequest(after=cursor)))

    assert after("m-base") == ["n-base", "a1@2", "c1@1", "d1@1"]
    assert after("n-base") == ["a1@2", "c1@1", "d1@1"]
    assert after("b1") == ["c1@1", "d1@1"]  # not listed, but a position among the adapters
    removed = CatalogModel(
        name="old-base", model_type="llama", shape={}, dtype="float32", files=[], num_bytes=0, engines=[],
        aliases=[], status="removed", removed_at=utcnow(),
    )  # fmt: skip
    db_session.add(removed)
    db_session.flush()
    db_session.add(BaseModelName(name="old-base", model_id=removed.id))
    db_session.flush()
    assert after("old-base") == ["a1@2", "c1@1", "d1@1"]  # a removed base model: no adapter is skipped


@pytest.mark.parametrize("cursor", ["Not A Name", "a@1", "-x", "x" * 65])
def test_a_cursor_that_is_no_model_name_is_invalid(db_session: Session, cursor: str) -> None:
    acme = add_tenant(db_session, "acme")
    with pytest.raises(InvalidCursorError):
        model_page(db_session, acme.id, BASE_NAMES, PageRequest(after=cursor))


def test_rows_inserted_between_pages_after_the_position_are_listed_once(db_session: Session) -> None:
    acme = _seed(db_session)

    def between(index: int) -> None:
        if index == 1:  # after a1: one behind the reader, one ahead
            add_adapter(db_session, acme, "a0")
            add_adapter(db_session, acme, "z9")

    pages = walk(
        lambda page: _as_page(model_page(db_session, acme.id, BASE_NAMES, page)),
        2,
        id_of=lambda model_id: model_id.split("@")[0],
        between=between,
    )
    assert [m for page in pages for m in page] == ["m-base", "n-base", "a1@2", "c1@1", "d1@1", "z9@1"]
