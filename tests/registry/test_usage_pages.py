"""Pages of a tenant's usage per (day, model), on SQLite and PostgreSQL (each test rolled back)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session

from registry.models import UsageRecord, new_id
from registry.pages import InvalidCursorError, PageRequest
from registry.usage_pages import usage_group_page, usage_token_totals
from registry.usage_reports import load_rows, usage_by_adapter_day
from tests.registry.page_rows import add_tenant, walk

DAY0 = datetime(2026, 11, 1, tzinfo=UTC)
START, END = DAY0, DAY0 + timedelta(days=10)


def _row(session: Session, tenant_id: str, day: int, model: str, prompt: int = 10, minute: int = 0) -> None:
    started = DAY0 + timedelta(days=day, hours=12, minutes=minute)
    session.add(
        UsageRecord(
            request_id=f"req-{new_id()}", tenant_id=tenant_id, model_name=model, prompt_tokens=prompt,
            completion_tokens=1, status="ok", started_at=started,
        )
    )  # fmt: skip
    session.flush()


def _seed(session: Session) -> tuple[str, str]:
    acme, bob = add_tenant(session, "acme"), add_tenant(session, "bob")
    for day, models in ((0, "abc"), (1, "b"), (3, "ca")):
        for i, model in enumerate(models):
            _row(session, acme.id, day, f"m-{model}", minute=i)
            _row(session, acme.id, day, f"m-{model}", prompt=5, minute=30 + i)
    _row(session, bob.id, 2, "m-b")  # another tenant's: never counted
    _row(session, acme.id, 20, "m-a")  # outside the period
    return acme.id, bob.id


@pytest.mark.parametrize("limit", [1, 2, 4, 100])
def test_walk_lists_every_day_and_model_group_once_in_order(db_session: Session, limit: int) -> None:
    acme, _ = _seed(db_session)
    pages = walk(
        lambda page: usage_group_page(db_session, acme, START, END, page), limit, id_of=lambda g: str(g["id"])
    )
    listed = [group for page in pages for group in page]
    expected = usage_by_adapter_day(load_rows(db_session, START, END, acme))
    assert [{k: v for k, v in g.items() if k != "id"} for g in listed] == expected
    assert [g["id"] for g in listed] == [
        "2026-11-01:m-a", "2026-11-01:m-b", "2026-11-01:m-c", "2026-11-02:m-b", "2026-11-04:m-a", "2026-11-04:m-c",
    ]  # fmt: skip
    assert listed[0]["num_requests"] == 2 and listed[0]["prompt_tokens"] == 15


def test_rows_arriving_between_pages_join_only_groups_not_yet_shown(db_session: Session) -> None:
    acme, _ = _seed(db_session)

    def between(index: int) -> None:
        if index == 0:  # after the groups of day 0: a row of a shown group, and one of a new later group
            _row(db_session, acme, 0, "m-a", minute=50)
            _row(db_session, acme, 5, "m-z")

    pages = walk(
        lambda page: usage_group_page(db_session, acme, START, END, page),
        3,
        id_of=lambda g: str(g["id"]),
        between=between,
    )
    ids = [g["id"] for page in pages for g in page]
    assert ids == [
        "2026-11-01:m-a", "2026-11-01:m-b", "2026-11-01:m-c", "2026-11-02:m-b", "2026-11-04:m-a", "2026-11-04:m-c",
        "2026-11-06:m-z",
    ]  # fmt: skip


def test_a_cursor_is_a_position_and_reads_only_the_callers_rows(db_session: Session) -> None:
    acme, bob = _seed(db_session)
    page = usage_group_page(db_session, acme, START, END, PageRequest(after="2026-11-02:m-a"))
    assert [g["id"] for g in page.items] == ["2026-11-02:m-b", "2026-11-04:m-a", "2026-11-04:m-c"]
    bobs = usage_group_page(db_session, bob, START, END, PageRequest(after="2026-11-01:m-a"))
    assert [g["id"] for g in bobs.items] == ["2026-11-03:m-b"]


@pytest.mark.parametrize("cursor", ["2026-11-01", "2026-11-01:", "2026-13-01:m-a", "x:m-a", "2026-W44-1:m"])
def test_a_cursor_that_is_no_group_id_is_invalid(db_session: Session, cursor: str) -> None:
    acme, _ = _seed(db_session)
    with pytest.raises(InvalidCursorError):
        usage_group_page(db_session, acme, START, END, PageRequest(after=cursor))


def test_token_totals_cover_the_whole_period_of_the_tenant_only(db_session: Session) -> None:
    acme, bob = _seed(db_session)
    assert usage_token_totals(db_session, acme, START, END) == (6 * 15, 12)
    assert usage_token_totals(db_session, bob, START, END) == (10, 1)
