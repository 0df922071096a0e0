"""The console's lists (adapters, keys, the operator's tenants) show a page at a time with links to the next
and the first page, as the REST lists do; a cursor of another tenant's row is the error page of an unknown one."""

from __future__ import annotations

import re
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from registry.models import ApiKey, Tenant
from registry.pages import DEFAULT_PAGE_SIZE
from tests.api.conftest import ADMIN_KEY, TenantHandle
from tests.api.console.console_support import sign_in
from tests.registry.page_rows import add_adapter, add_tenant, at

NEXT_LINK = re.compile(r'href="([^"]+)" rel="next"')


def _walk(client: TestClient, path: str, row_pattern: str) -> list[list[str]]:
    """The rows (matches of row_pattern) of every page of a console list, following its Next links."""
    pages = []
    while True:
        page = client.get(path)
        assert page.status_code == 200, page.text
        pages.append(re.findall(row_pattern, page.text))
        found = NEXT_LINK.search(page.text)
        if found is None:
            assert len(pages) == 1 or "First page" in page.text
            return pages
        path = found[1]


def test_adapters_page_shows_a_page_at_a_time_by_name(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    row = db_session.get_one(Tenant, tenant.id)
    names = [f"a-{i:03d}" for i in range(DEFAULT_PAGE_SIZE + 5)]
    for name in reversed(names):
        add_adapter(db_session, row, name)
    sign_in(client, tenant.key)
    pages = _walk(client, "/console/adapters", r'href="/console/adapters/([a-z0-9.-]+)"')
    assert [len(p) for p in pages] == [DEFAULT_PAGE_SIZE, 5]
    assert [name for page in pages for name in page] == names


def test_keys_page_shows_a_page_at_a_time_newest_first(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    for i in range(DEFAULT_PAGE_SIZE + 2):
        db_session.add(ApiKey(tenant_id=tenant.id, salt="s", secret_hash="h", created_at=at(i)))
    db_session.flush()
    sign_in(client, tenant.key)
    pages = _walk(client, "/console/keys", r"<tr><td><code>([0-9a-f-]{36})</code>")
    listed = [key for page in pages for key in page]
    assert [len(p) for p in pages] == [DEFAULT_PAGE_SIZE, 3]
    assert (
        listed[0] == tenant.key_id and len(set(listed)) == DEFAULT_PAGE_SIZE + 3
    )  # the newest: the fixture's


def test_operator_tenants_page_shows_a_page_at_a_time(client: TestClient, db_session: Session) -> None:
    for i in range(DEFAULT_PAGE_SIZE + 1):
        add_tenant(db_session, f"tenant-{i:03d}", created_at=at(i))
    sign_in(client, ADMIN_KEY)
    pages = _walk(client, "/console/admin/tenants", r'<tr data-tenant="([^"]+)">')
    assert [len(p) for p in pages] == [DEFAULT_PAGE_SIZE, 1]
    assert [name for page in pages for name in page] == [
        f"tenant-{i:03d}" for i in range(DEFAULT_PAGE_SIZE + 1)
    ]


@pytest.mark.parametrize("path", ["/console/adapters", "/console/keys"])
def test_another_tenants_row_as_cursor_is_the_error_page_of_an_unknown_one(
    client: TestClient, tenant: TenantHandle, new_tenant, db_session: Session, path: str
) -> None:
    bob = new_tenant("bob")
    foreign = (
        add_adapter(db_session, db_session.get_one(Tenant, bob.id), "secret").id
        if "adapters" in path
        else bob.key_id
    )
    unknown = str(uuid.uuid4())
    sign_in(client, tenant.key)
    answers = [client.get(path, params={"after": after}) for after in (foreign, unknown)]
    assert [a.status_code for a in answers] == [400, 400]
    assert answers[0].text.replace(foreign, "<id>") == answers[1].text.replace(unknown, "<id>")


def test_playground_lists_the_adapters_the_tenant_calls_by_name(
    client: TestClient, tenant: TenantHandle, new_tenant, db_session: Session
) -> None:
    add_adapter(db_session, db_session.get_one(Tenant, tenant.id), "mine")
    add_adapter(db_session, db_session.get_one(Tenant, tenant.id), "draft", ("validating",))
    bob = db_session.get_one(Tenant, new_tenant("bob").id)
    add_adapter(db_session, bob, "shared", visibility="public")
    add_adapter(db_session, bob, "secret")
    sign_in(client, tenant.key)
    page = client.get("/console/playground")
    assert page.status_code == 200
    assert re.findall(r'<option value="([^"]+)"', page.text) == ["mine", "shared"]
