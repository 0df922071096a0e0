"""The daily usage rollup (registry/usage_rollup.py, read through registry/usage_days.py): billing's sums, a
tenant's token totals and its /v1/usage pages are the same with rolled days as from the raw rows alone, for
periods that start and end mid-day; a day is rolled only once settled and with no open row; a late change to a
rolled day's rows (the final update of a swept row, an insert dated back) un-rolls it in the same transaction;
a read that sees the marks change reads again."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from registry import repository
from registry.billing import usage_totals
from registry.models import USAGE_STATUSES, RolledUsageDay, Tenant, UsageDay, UsageRecord, new_id
from registry.pages import PageRequest
from registry.usage import finish_usage, record_usage
from registry.usage_batches import open_usage
from registry.usage_days import UsageTotals, read_stably, rolled_marks, segments, whole_days
from registry.usage_pages import usage_group_page, usage_token_totals
from registry.usage_reports import load_rows
from registry.usage_rollup import day_bounds, days_to_roll, roll_up_day, roll_up_usage, unroll_days

DAY0 = datetime(2026, 3, 1, tzinfo=UTC)
NOW = DAY0 + timedelta(days=12, hours=5)  # days 0..11 are settled with settle_s <= 5 h
SETTLE_S = 3600.0
CLOSED = sorted(set(USAGE_STATUSES) - {"in_progress"})


@pytest.fixture
def tenant_ids(db_session: Session) -> Iterator[list[str]]:
    ids = [repository.create_tenant(db_session, f"t-{new_id()[:8]}").id for _ in range(3)]
    db_session.commit()
    yield ids


def _add_rows(session: Session, tenant_ids: list[str], rng: random.Random, num_rows: int) -> None:
    for _ in range(num_rows):
        session.add(
            UsageRecord(
                request_id=new_id(),
                tenant_id=rng.choice(tenant_ids),
                model_name=rng.choice(["a", "b", "c:d", "B"]),
                base_model_name=rng.choice(["small", "wide", None]),
                prompt_tokens=rng.randrange(0, 5000),
                completion_tokens=rng.randrange(0, 900),
                status=rng.choice(CLOSED),
                started_at=DAY0 + timedelta(seconds=rng.uniform(0, 12 * 86400)),
            )
        )
    session.commit()


def _raw_totals(
    session: Session, start: datetime, end: datetime, tenant_ids: list[str]
) -> dict[tuple[str, str], UsageTotals]:
    groups: dict[tuple[str, str], list] = {}
    for row in load_rows(session, start, end):
        if row.tenant_id in tenant_ids:
            groups.setdefault((row.tenant_id, row.base_model), []).append(row)
    return {key: UsageTotals.of_rows(rows) for key, rows in groups.items()}


def _periods(rng: random.Random) -> list[tuple[datetime, datetime]]:
    periods = [(DAY0, DAY0 + timedelta(days=12)), (DAY0 + timedelta(days=3), DAY0 + timedelta(days=4))]
    for _ in range(12):
        a, b = sorted(rng.uniform(-1, 13) for _ in range(2))
        periods.append((DAY0 + timedelta(days=a), DAY0 + timedelta(days=b)))
    return periods


def _all_pages(
    session: Session, tenant_id: str, start: datetime, end: datetime, limit: int
) -> list[list[dict]]:
    pages, after = [], None
    while True:
        page = usage_group_page(session, tenant_id, start, end, PageRequest(limit=limit, after=after))
        pages.append(page.items)
        if not page.has_more:
            return pages
        after = str(page.items[-1]["id"])


def test_sums_and_pages_are_the_raw_rows_whatever_days_are_rolled(
    db_session: Session, tenant_ids: list[str]
) -> None:
    rng = random.Random(11)
    _add_rows(db_session, tenant_ids, rng, 600)
    periods = _periods(rng)
    raw = [_raw_totals(db_session, s, e, tenant_ids) for s, e in periods]
    raw_pages = {
        (t, s, e, n): _all_pages(db_session, t, s, e, n)
        for t in tenant_ids[:2]
        for s, e in periods[:4]
        for n in (1, 7)
    }
    raw_tokens = {(t, s, e): usage_token_totals(db_session, t, s, e) for t in tenant_ids for s, e in periods}
    # some days rolled, then all of them
    for rolled in ([2, 3, 7], list(range(12))):
        for day in rolled:
            roll_up_day(db_session, (DAY0 + timedelta(days=day)).date(), NOW)
        assert len(rolled_marks(db_session, DAY0, DAY0 + timedelta(days=12))) == len(rolled)
        for (s, e), expected in zip(periods, raw, strict=True):
            got = {k: v for k, v in usage_totals(db_session, s, e).items() if k[0] in tenant_ids}
            assert got == expected, (s, e)
        for (t, s, e), tokens in raw_tokens.items():
            assert usage_token_totals(db_session, t, s, e) == tokens
        for (t, s, e, n), pages in raw_pages.items():
            assert _all_pages(db_session, t, s, e, n) == pages
    assert db_session.scalar(select(func.count()).select_from(UsageDay)) < 600  # the rollup is smaller


def test_only_settled_days_without_open_rows_are_rolled_and_a_run_is_bounded(
    db_session: Session, tenant_ids: list[str]
) -> None:
    _add_rows(db_session, tenant_ids, random.Random(3), 200)
    open_day = DAY0 + timedelta(days=4, hours=3)
    open_usage(db_session, [{"id": new_id(), "request_id": "open-1", "tenant_id": tenant_ids[0], "model_name": "a",
                             "status": "in_progress", "started_at": open_day}])  # fmt: skip
    late = DAY0 + timedelta(days=11, hours=23)
    # at 00:30 on day 12 day 11 has not settled for an hour yet
    assert (
        days_to_roll(db_session, DAY0 + timedelta(days=12, minutes=30), SETTLE_S)[-1]
        == (late - timedelta(days=1)).date()
    )
    assert roll_up_day(db_session, open_day.date(), NOW) is False  # an open row holds the day
    assert roll_up_usage(db_session, SETTLE_S, NOW, max_days=5) == [
        (DAY0 + timedelta(days=d)).date() for d in (0, 1, 2, 3, 5)
    ]
    days = roll_up_usage(db_session, SETTLE_S, NOW)
    assert days == [(DAY0 + timedelta(days=d)).date() for d in (6, 7, 8, 9, 10, 11)]
    assert roll_up_usage(db_session, SETTLE_S, NOW) == []  # nothing left
    assert roll_up_day(db_session, DAY0.date(), NOW) is False  # rolled once only
    finish_usage(
        db_session, {"request_id": "open-1", "status": "ok", "prompt_tokens": 5, "completion_tokens": 2}
    )
    assert roll_up_usage(db_session, SETTLE_S, NOW) == [open_day.date()]


def test_a_late_change_to_a_rolled_day_unrolls_it_and_the_sums_stay_exact(
    db_session: Session, tenant_ids: list[str]
) -> None:
    _add_rows(db_session, tenant_ids, random.Random(5), 150)
    day = DAY0 + timedelta(days=2)
    swept = {"id": new_id(), "request_id": "swept-1", "tenant_id": tenant_ids[0], "model_name": "a",
             "base_model_name": "small", "status": "interrupted", "prompt_tokens": 10, "completion_tokens": 3,
             "started_at": day + timedelta(hours=6)}  # fmt: skip
    db_session.add(UsageRecord(**swept))
    db_session.commit()
    roll_up_usage(db_session, SETTLE_S, NOW)
    period = (DAY0, DAY0 + timedelta(days=12))
    assert day.date() in rolled_marks(db_session, *period)
    # the API that was still serving it gives the swept row its final values
    assert finish_usage(
        db_session, {"request_id": "swept-1", "status": "ok", "prompt_tokens": 10, "completion_tokens": 40}
    )
    assert day.date() not in rolled_marks(db_session, *period)
    assert not db_session.scalars(select(UsageDay).where(UsageDay.day == day.date())).all()
    assert (
        usage_totals(db_session, *period)[(tenant_ids[0], "small")]
        == _raw_totals(db_session, *period, tenant_ids)[(tenant_ids[0], "small")]
    )
    assert roll_up_usage(db_session, SETTLE_S, NOW) == [day.date()]
    assert {k: v for k, v in usage_totals(db_session, *period).items() if k[0] in tenant_ids} == _raw_totals(
        db_session, *period, tenant_ids
    )
    # a row dated back (a fallback insert of a request that started days ago) un-rolls its day too
    record_usage(db_session, request_id="late-1", tenant_id=tenant_ids[1], model_name="b", base_model_name="wide",
                 status="ok", prompt_tokens=7, completion_tokens=1, started_at=day + timedelta(days=1, hours=1))  # fmt: skip
    assert (day + timedelta(days=1)).date() not in rolled_marks(db_session, *period)
    assert {k: v for k, v in usage_totals(db_session, *period).items() if k[0] in tenant_ids} == _raw_totals(
        db_session, *period, tenant_ids
    )
    assert finish_usage(db_session, {"request_id": "nobody", "status": "ok"}) is False


def test_a_read_that_sees_the_marks_change_reads_again(db_session: Session, tenant_ids: list[str]) -> None:
    _add_rows(db_session, tenant_ids, random.Random(9), 50)
    roll_up_usage(db_session, SETTLE_S, NOW)
    period = (DAY0, DAY0 + timedelta(days=12))
    seen: list[int] = []

    def read(marks: dict[date, datetime]) -> int:
        seen.append(len(marks))
        if len(seen) == 1:
            unroll_days(db_session, [DAY0.date()])  # as a late change committing mid-read would
        return len(marks)

    assert read_stably(db_session, *period, read) == 11
    assert seen == [12, 11]


def test_deleting_a_tenant_deletes_its_rolled_usage(db_session: Session, tenant_ids: list[str]) -> None:
    _add_rows(db_session, tenant_ids, random.Random(1), 60)
    roll_up_usage(db_session, SETTLE_S, NOW)
    db_session.execute(delete(Tenant).where(Tenant.id == tenant_ids[0]))
    db_session.commit()
    assert not db_session.scalars(select(UsageDay).where(UsageDay.tenant_id == tenant_ids[0])).all()
    assert db_session.scalars(select(UsageDay).where(UsageDay.tenant_id == tenant_ids[1])).all()
    assert db_session.scalars(select(RolledUsageDay)).all()


def test_whole_days_and_segments_cut_a_period_at_rolled_days() -> None:
    start, end = DAY0 + timedelta(hours=5), DAY0 + timedelta(days=4, hours=1)
    assert whole_days(start, end) == ((DAY0 + timedelta(days=1)).date(), (DAY0 + timedelta(days=4)).date())
    assert whole_days(DAY0, DAY0 + timedelta(days=1)) == (DAY0.date(), (DAY0 + timedelta(days=1)).date())
    d1, d2, d3 = ((DAY0 + timedelta(days=n)).date() for n in (1, 2, 3))
    assert segments(start, end, [d1, d3]) == [
        (start, day_bounds(d1)[0], False),
        (*day_bounds(d1), True),
        (*day_bounds(d2), False),
        (*day_bounds(d3), True),
        (day_bounds(d3)[1], end, False),
    ]
    assert segments(start, end, [d1, d2]) == [
        (start, day_bounds(d1)[0], False),
        (day_bounds(d1)[0], day_bounds(d2)[1], True),
        (day_bounds(d2)[1], end, False),
    ]
    assert segments(start, end, []) == [(start, end, False)]
