"""The daily usage rollup: each settled UTC day's usage rows summed per (tenant, model name, base model, status)
into usage_days, so billing and a tenant's usage read a few rows per day instead of every request
(registry/usage_days.py reads them).

A day is rolled once it is settled: `settle_s` past its end (request rows are inserted when they start, so no
new row can name it) and none of its rows is open (the usage sweep closed them). The sums and the day's mark in
rolled_usage_days are written in one transaction, under the rollup lock.

Exactness: the only later changes to a settled day's rows are rare (the final update of a row the sweep had
closed as `interrupted`, or an insert of a row that started in an earlier day: a fallback write). Each takes
the rollup lock and deletes the day's mark and sums in its own transaction (unroll_days); readers then sum the
day's raw rows until the next run rolls it again. The lock orders a change and a roll, so a roll never misses a
change that committed before it, and a change never leaves sums it made stale.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import Date, delete, func, insert, literal, select, text
from sqlalchemy.orm import Session

from registry.db import begin_write
from registry.models import OPEN_USAGE_STATUS, RolledUsageDay, UsageDay, UsageRecord, utcnow

log = logging.getLogger(__name__)

MAX_DAYS_PER_RUN = 31  # a first run over a year of rows rolls it in a dozen sweeps, none of them long


# What usage_days holds of a group of usage rows, as SQL over usage_records: a row's base model ("" for none),
# then requests, prompt and completion tokens and the earliest start (the rollup, and the pages of days not
# rolled, sum the same way).
ROW_BASE_MODEL = func.coalesce(UsageRecord.base_model_name, "")
DAY_SUM_COLUMNS = (
    func.count(),
    func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
    func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
    func.min(UsageRecord.started_at),
)


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """[start, end) of a UTC day."""
    start = datetime.combine(day, time(), tzinfo=UTC)
    return start, start + timedelta(days=1)


def first_unsettled_day(now: datetime, settle_s: float) -> date:
    """The first UTC day that is not settled at `now`: every earlier day ended at least settle_s ago."""
    return (now.astimezone(UTC) - timedelta(seconds=settle_s)).date()


def lock_usage_rollup(session: Session) -> None:
    """Hold off rolls and un-rolls of days until this transaction ends (PostgreSQL: a self-exclusive table lock;
    SQLite: its one writer, taken now by a write that changes nothing)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("LOCK TABLE rolled_usage_days IN SHARE ROW EXCLUSIVE MODE"))
    else:
        session.execute(delete(RolledUsageDay).where(RolledUsageDay.day.is_(None)))


def unroll_days(session: Session, days: Iterable[date]) -> int:
    """Delete the marks and sums of `days` (their rows are about to change); returns how many were rolled.
    The caller holds lock_usage_rollup and commits with its change."""
    days = sorted(set(days))
    if not days:
        return 0
    session.execute(delete(UsageDay).where(UsageDay.day.in_(days)))
    num_unrolled = session.execute(delete(RolledUsageDay).where(RolledUsageDay.day.in_(days))).rowcount  # type: ignore[attr-defined]
    if num_unrolled:
        log.info("usage of %s changed after it was rolled up; it is read raw until the next rollup", days)
    return int(num_unrolled or 0)


def utc_day(moment: datetime) -> date:
    """The UTC day of a moment (naive values are UTC: SQLite returns them)."""
    return (moment.astimezone(UTC) if moment.tzinfo else moment).date()


def unroll_days_of(session: Session, started: Iterable[datetime | None], now: datetime | None = None) -> None:
    """Before rows with these started_at are written: un-roll the days before today they fall in (the lock is
    taken only when there is one). The caller commits with its write."""
    past = past_days(started, now)
    if past:
        lock_usage_rollup(session)
        unroll_days(session, past)


def past_days(started: Iterable[datetime | None], now: datetime | None = None) -> set[date]:
    """The UTC days before today (at `now`) that these moments fall in: a row written now that started in one of
    them changes a day the rollup may have summed."""
    today = utc_day(now or utcnow())
    return {day for day in (utc_day(moment) for moment in started if moment is not None) if day < today}


def days_to_roll(
    session: Session, now: datetime, settle_s: float, max_days: int = MAX_DAYS_PER_RUN
) -> list[date]:
    """The first max_days settled days that are not rolled, from the oldest usage row's day on, that have no
    open row."""
    oldest = session.scalar(select(func.min(UsageRecord.started_at)))
    if oldest is None:
        return []
    first = utc_day(oldest)
    cutoff = first_unsettled_day(now, settle_s)
    rolled = set(session.scalars(select(RolledUsageDay.day).where(RolledUsageDay.day >= first)))
    open_started = session.scalars(
        select(UsageRecord.started_at).where(UsageRecord.status == OPEN_USAGE_STATUS)
    )
    open_days = {utc_day(moment) for moment in open_started}
    days: list[date] = []
    day = first
    while day < cutoff and len(days) < max_days:
        if day not in rolled and day not in open_days:
            days.append(day)
        day += timedelta(days=1)
    return days


def roll_up_day(session: Session, day: date, now: datetime | None = None) -> bool:
    """Sum the day's rows into usage_days and mark it rolled, in one transaction under the rollup lock; False,
    writing nothing, when one of its rows is open or it is rolled already."""
    start, end = day_bounds(day)
    if session.in_transaction():
        session.commit()
    begin_write(session)  # SQLite: BEGIN IMMEDIATE, so the reads below see what the writes will be based on
    lock_usage_rollup(session)
    is_rolled = session.scalar(select(RolledUsageDay.day).where(RolledUsageDay.day == day)) is not None
    is_open = session.scalar(
        select(UsageRecord.id)
        .where(
            UsageRecord.status == OPEN_USAGE_STATUS,
            UsageRecord.started_at >= start,
            UsageRecord.started_at < end,
        )
        .limit(1)
    )
    if is_rolled or is_open is not None:
        session.commit()  # wrote nothing; ends the transaction and its lock
        return False
    keys = [UsageRecord.tenant_id, UsageRecord.model_name, ROW_BASE_MODEL, UsageRecord.status]
    sums = (
        select(UsageRecord.tenant_id, literal(day, Date), *keys[1:], *DAY_SUM_COLUMNS)
        .where(UsageRecord.started_at >= start, UsageRecord.started_at < end)
        .group_by(*keys)
    )
    columns = [
        "tenant_id", "day", "model_name", "base_model_name", "status", "num_requests", "prompt_tokens",
        "completion_tokens", "first_started_at",
    ]  # fmt: skip
    session.execute(insert(UsageDay).from_select(columns, sums))
    session.add(RolledUsageDay(day=day, rolled_at=now or utcnow()))
    session.commit()
    return True


def roll_up_usage(
    session: Session, settle_s: float, now: datetime | None = None, max_days: int = MAX_DAYS_PER_RUN
) -> list[date]:
    """Roll up the first max_days settled days that are not rolled yet; returns the days rolled."""
    now = now or utcnow()
    rolled = [day for day in days_to_roll(session, now, settle_s, max_days) if roll_up_day(session, day, now)]
    session.commit()
    return rolled
