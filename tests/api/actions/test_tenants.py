"""The tenant and plan actions run on a session alone: no Request, no auth dependency."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.actions import tenants
from registry import repository
from registry.pages import PageRequest


def test_list_plans_returns_the_api_shape_by_name_without_a_request(db_session: Session) -> None:
    repository.create_price_plan(db_session, "pro")
    repository.create_price_plan(db_session, "basic")
    repository.create_price_plan(db_session, "team")
    first = tenants.list_plans(db_session, PageRequest(limit=2))
    assert [p.name for p in first.data] == ["basic", "pro"] and first.has_more
    rest = tenants.list_plans(db_session, PageRequest(limit=2, after=first.last_id))
    assert [p.name for p in rest.data] == ["team"] and not rest.has_more
