"""Reading usage through the daily rollup (registry/usage_rollup.py): the rolled days wholly inside a period are
read from usage_days, the rest of the period (its partial first and last days, today, days not rolled yet) from
the raw rows, so each request is counted exactly once and the sums equal the raw rows' sums.

A read takes the rolled days' marks, reads, and takes the marks again; a day un-rolled (or rolled again) in
between makes it read again (read_stably), so a late change to a rolled day is never half-seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, and_, false, func, or_, select
from sqlalchemy.orm import Session

from registry.models import RolledUsageDay, UsageDay, UsageRecord
from registry.usage_reports import UsageRow
from registry.usage_rollup import day_bounds

T = TypeVar("T")
MAX_READS = 5  # a read retried this often under constant un-rolls gives up (RuntimeError, a 500 to retry)
Marks = dict[date, datetime]  # a rolled day -> when it was rolled


@dataclass(frozen=True)
class UsageTotals:
    """What a group of usage rows adds up to (a tenant's requests on one base model in a period: what billing
    prices)."""

    num_requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def of_rows(cls, rows: Iterable[UsageRow]) -> UsageTotals:
        """The totals of `rows`."""
        rows = list(rows)
        return cls(len(rows), sum(r.prompt_tokens for r in rows), sum(r.completion_tokens for r in rows))

    def __add__(self, other: UsageTotals) -> UsageTotals:
        return UsageTotals(
            self.num_requests + other.num_requests,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


def whole_days(start: datetime, end: datetime) -> tuple[date, date]:
    """[first, last) of the UTC days that lie wholly inside [start, end) (first >= last: none)."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    first = start.date() if start == day_bounds(start.date())[0] else start.date() + timedelta(days=1)
    return first, end.date()


def day_ranges(days: Iterable[date]) -> list[tuple[date, date]]:
    """Runs of consecutive days as [first, last + 1 day) ranges, in order (a query by range, not by a list of
    dates, lets PostgreSQL plan one index range per run)."""
    ranges: list[tuple[date, date]] = []
    for day in sorted(set(days)):
        if ranges and ranges[-1][1] == day:
            ranges[-1] = (ranges[-1][0], day + timedelta(days=1))
        else:
            ranges.append((day, day + timedelta(days=1)))
    return ranges


def in_days(column: Any, days: Iterable[date]) -> ColumnElement[bool]:
    """`column` (a date) falls on one of `days` (false for none), as one range condition per run of days."""
    return or_(false(), *(and_(column >= first, column < end) for first, end in day_ranges(days)))


def rolled_marks(session: Session, start: datetime, end: datetime) -> Marks:
    """The rolled days wholly inside [start, end), each with when it was rolled."""
    first, last = whole_days(start, end)
    if first >= last:
        return {}
    query = select(RolledUsageDay.day, RolledUsageDay.rolled_at).where(
        RolledUsageDay.day >= first, RolledUsageDay.day < last
    )
    return {day: rolled_at for day, rolled_at in session.execute(query)}


def raw_intervals(start: datetime, end: datetime, rolled: Iterable[date]) -> list[tuple[datetime, datetime]]:
    """The parts of [start, end) outside the rolled days, in order, adjacent parts merged."""
    intervals: list[tuple[datetime, datetime]] = []
    cursor = start
    for day in sorted(rolled):
        day_start, day_end = day_bounds(day)
        if cursor < day_start:
            intervals.append((cursor, day_start))
        cursor = max(cursor, day_end)
    if cursor < end:
        intervals.append((cursor, end))
    return intervals


def segments(start: datetime, end: datetime, rolled: Iterable[date]) -> list[tuple[datetime, datetime, bool]]:
    """[start, end) cut into parts in order, each (part start, part end, is it rolled days), adjacent parts of
    the same kind merged."""
    parts = [(s, e, False) for s, e in raw_intervals(start, end, rolled)]
    for day in sorted(rolled):
        day_start, day_end = day_bounds(day)
        parts.append((day_start, day_end, True))
    merged: list[tuple[datetime, datetime, bool]] = []
    for part in sorted(parts):
        if merged and merged[-1][2] == part[2] and merged[-1][1] == part[0]:
            merged[-1] = (merged[-1][0], part[1], part[2])
        else:
            merged.append(part)
    return merged


def read_stably(session: Session, start: datetime, end: datetime, read: Callable[[Marks], T]) -> T:
    """read(marks of the rolled days in [start, end)), again while the marks changed during the read."""
    marks = rolled_marks(session, start, end)
    for _ in range(MAX_READS):
        result = read(marks)
        again = rolled_marks(session, start, end)
        if again == marks:
            return result
        marks = again
    raise RuntimeError(
        f"the usage rollup of {start:%Y-%m-%d}..{end:%Y-%m-%d} kept changing during a read; retry"
    )


def usage_sums(
    session: Session, start: datetime, end: datetime, *, by_tenant: bool, tenant_id: str | None = None
) -> dict[tuple[str, ...], UsageTotals]:
    """Sums of the usage rows with start <= started_at < end per (tenant id, base model) when by_tenant, else
    per (base model,), optionally of one tenant; base model "" for rows that name none."""
    return read_stably(
        session, start, end, lambda marks: _sums(session, start, end, marks, by_tenant, tenant_id)
    )


def _sums(
    session: Session, start: datetime, end: datetime, marks: Marks, by_tenant: bool, tenant_id: str | None
) -> dict[tuple[str, ...], UsageTotals]:
    sums: dict[tuple[str, ...], UsageTotals] = {}
    rolled_keys: list[Any] = [UsageDay.tenant_id] if by_tenant else []
    rolled_keys.append(UsageDay.base_model_name)
    if marks:
        query = select(
            *rolled_keys,
            func.sum(UsageDay.num_requests),
            func.sum(UsageDay.prompt_tokens),
            func.sum(UsageDay.completion_tokens),
        ).where(in_days(UsageDay.day, marks))
        if tenant_id is not None:
            query = query.where(UsageDay.tenant_id == tenant_id)
        for *key, n, prompt, completion in session.execute(query.group_by(*rolled_keys)):
            _add(sums, tuple(key), UsageTotals(int(n), int(prompt), int(completion)))
    base = func.coalesce(UsageRecord.base_model_name, "")
    raw_keys: list[Any] = [UsageRecord.tenant_id, base] if by_tenant else [base]
    for interval_start, interval_end in raw_intervals(start, end, marks):
        query = select(
            *raw_keys,
            func.count(),
            func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
            func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
        ).where(UsageRecord.started_at >= interval_start, UsageRecord.started_at < interval_end)
        if tenant_id is not None:
            query = query.where(UsageRecord.tenant_id == tenant_id)
        for *key, n, prompt, completion in session.execute(query.group_by(*raw_keys)):
            _add(sums, tuple(key), UsageTotals(int(n), int(prompt), int(completion)))
    return sums


def _add(sums: dict[tuple[str, ...], UsageTotals], key: tuple[str, ...], more: UsageTotals) -> None:
    sums[key] = sums.get(key, UsageTotals()) + more
