"""Pages of the operator's tenants and of a tenant's API keys, on SQLite and PostgreSQL (each test rolled back)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.orm import Session

from registry import account_pages
from registry.models import ApiKey, Tenant
from registry.pages import InvalidCursorError, PageRequest
from tests.registry.page_rows import add_tenant, at, walk


@pytest.mark.parametrize("limit", [1, 2, 4])
def test_walk_lists_every_tenant_once_oldest_first_ties_by_id(db_session: Session, limit: int) -> None:
    tied = [add_tenant(db_session, f"tied-{i}", created_at=at(10)) for i in range(5)]
    early, late = (
        add_tenant(db_session, "early", created_at=at(1)),
        add_tenant(db_session, "late", created_at=at(20)),
    )

    def between(index: int) -> None:
        if index == 0:  # one behind the reader's position, one ahead of it
            add_tenant(db_session, "earliest", created_at=at(0))
            add_tenant(db_session, "latest", created_at=at(30))

    pages = walk(lambda page: account_pages.tenant_page(db_session, page), limit, between=between)
    listed = [t.name for page in pages for t in page]
    in_order = [early, *sorted(tied, key=lambda t: t.id), late]
    assert listed == [t.name for t in in_order] + ["latest"]


def _key(session: Session, tenant: Tenant, seconds: float, is_revoked: bool = False) -> ApiKey:
    key = ApiKey(tenant_id=tenant.id, salt="s", secret_hash="h", created_at=at(seconds))
    key.revoked_at = at(seconds + 1) if is_revoked else None
    session.add(key)
    session.flush()
    return key


def test_walk_lists_a_tenants_keys_newest_first_revoked_included(db_session: Session) -> None:
    acme, bob = add_tenant(db_session, "acme"), add_tenant(db_session, "bob")
    keys = [_key(db_session, acme, s, is_revoked=s % 2 == 0) for s in (1, 2, 3, 3, 3, 4)]
    _key(db_session, bob, 5)
    pages = walk(lambda page: account_pages.api_key_page(db_session, acme.id, page), 2)
    listed = [k.id for page in pages for k in page]
    assert listed == [k.id for k in sorted(keys, key=lambda k: (k.created_at, k.id), reverse=True)]


def test_another_tenants_key_is_the_same_invalid_cursor_as_an_unknown_id(db_session: Session) -> None:
    acme, bob = add_tenant(db_session, "acme"), add_tenant(db_session, "bob")
    _key(db_session, acme, 1)
    bobs = _key(db_session, bob, 1)
    messages = []
    for after in (bobs.id, str(uuid.uuid4())):
        with pytest.raises(InvalidCursorError) as caught:
            account_pages.api_key_page(db_session, acme.id, PageRequest(after=after))
        messages.append(caught.value.message.replace(after, "<id>"))
    assert messages[0] == messages[1]
