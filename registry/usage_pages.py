"""Pages of a tenant's usage per (UTC day, model) (GET /v1/usage): keyset pagination over the groups.

A group's id is `<day>:<model>` (`2026-11-01:my-adapter`; the day comes first and has no ':', so a model name
with ':' in it still parses), and groups are in (day, model) order, so the cursor (`after`, the last id of the
previous page) is a position: the page reads from the start of the cursor's day on, day by day, and stops at
the first day boundary past limit + 1 groups. A day the daily rollup holds (registry/usage_rollup.py) is read
from its sums in usage_days (a few rows per model); any other day is summed the same way from the tenant's raw
rows, in the database, a day at a time (ix_usage_records_tenant_started). A page thus costs the days it shows,
whatever page it is. A cursor reads only the
calling tenant's rows, so it tells nothing about anyone else's; a cursor that is not of that shape is an
InvalidCursorError.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.models import UsageDay, UsageRecord
from registry.pages import Page, PageRequest, invalid_cursor, split_page
from registry.usage import as_utc
from registry.usage_days import Marks, read_stably, segments, usage_sums
from registry.usage_rollup import DAY_SUM_COLUMNS, ROW_BASE_MODEL, day_bounds, utc_day

NUM_STREAMED_ROWS = 500  # rows fetched per round trip while a page is read (a page reads whole days)
GROUP_ID_RE = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2}):(.+)", re.DOTALL)

GroupKey = tuple[str, str]  # (UTC day as YYYY-MM-DD, model name)


def usage_group_id(day: str, model: str) -> str:
    """The id of a (day, model) group."""
    return f"{day}:{model}"


def parse_usage_cursor(after: str) -> GroupKey:
    """The (day, model) position of a group id; InvalidCursorError when `after` is not one."""
    match = GROUP_ID_RE.fullmatch(after)
    if match is None:
        raise invalid_cursor(after)
    try:
        datetime.strptime(match[1], "%Y-%m-%d")
    except ValueError:
        raise invalid_cursor(after) from None
    return match[1], match[2]


def usage_group_page(
    session: Session, tenant_id: str, start: datetime, end: datetime, page: PageRequest
) -> Page[dict[str, object]]:
    """The tenant's totals per (day, model) in [start, end) after the cursor's group, at most page.limit,
    each with its `id`: rolled days from the daily rollup, the rest from the raw rows."""
    position = None if page.after is None else parse_usage_cursor(page.after)
    first = start if position is None else max(start, datetime.fromisoformat(position[0]).replace(tzinfo=UTC))
    data = read_stably(
        session,
        first,
        end,
        lambda marks: _groups_after(session, tenant_id, first, end, marks, position, page.limit),
    )
    for group in data:
        group["id"] = usage_group_id(str(group["day"]), str(group["model"]))
    return split_page(data, page.limit)


@dataclass(frozen=True)
class DaySum:
    """One day's usage of a tenant's model on one base model with one status: a usage_days row, or the same sums
    taken from the raw rows of a day that is not rolled."""

    day: str  # YYYY-MM-DD
    model: str
    base_model: str  # "" for rows that name none
    status: str
    num_requests: int
    prompt_tokens: int
    completion_tokens: int
    first_started_at: datetime


def _groups_after(
    session: Session,
    tenant_id: str,
    start: datetime,
    end: datetime,
    marks: Marks,
    position: GroupKey | None,
    limit: int,
) -> list[dict[str, object]]:
    """The first groups after `position` in [start, end), whole days, more than `limit` of them when there are:
    rolled days from usage_days, other days summed from their raw rows in the database a day at a time."""
    groups: dict[GroupKey, list[DaySum]] = {}
    for part_start, part_end, is_rolled in segments(start, end, marks):
        # raw: a day at a time, only days with rows: a long unrolled stretch costs only the days a page shows
        parts = (
            [(part_start, part_end)]
            if is_rolled
            else _days_with_rows(session, tenant_id, part_start, part_end)
        )
        for a, b in parts:
            if len(groups) > limit:
                break
            sums = (
                _rolled_sums(session, tenant_id, a, b) if is_rolled else _raw_sums(session, tenant_id, a, b)
            )
            _add_whole_days(groups, sums, position, limit + 1)
    return [
        _group(day, model, sorted(rows, key=lambda r: r.first_started_at))
        for (day, model), rows in sorted(groups.items())
    ]


def _days_with_rows(
    session: Session, tenant_id: str, start: datetime, end: datetime
) -> Iterator[tuple[datetime, datetime]]:
    """The parts of [start, end), one per UTC day, that hold some of the tenant's rows, in order, found lazily
    (one index seek per day found, ix_usage_records_tenant_started)."""
    cursor = start
    while cursor < end:
        first = session.scalar(
            select(func.min(UsageRecord.started_at)).where(
                UsageRecord.tenant_id == tenant_id,
                UsageRecord.started_at >= cursor,
                UsageRecord.started_at < end,
            )
        )
        if first is None:
            return
        day_start, day_end = day_bounds(utc_day(first))
        yield max(cursor, day_start), min(day_end, end)
        cursor = day_end


def _add_whole_days(
    groups: dict[GroupKey, list[DaySum]], sums: Iterator[DaySum], position: GroupKey | None, num_groups: int
) -> None:
    """Add the sums after `position` to their groups, day by day, stopping at the first day that starts once
    num_groups groups are complete (sums come in day order)."""
    day = None
    for row in sums:
        key = (row.day, row.model)
        if key[0] != day:
            if len(groups) >= num_groups:  # every group so far is of an earlier, complete day
                return
            day = key[0]
        if position is None or key > position:
            groups.setdefault(key, []).append(row)


def _rolled_sums(session: Session, tenant_id: str, start: datetime, end: datetime) -> Iterator[DaySum]:
    """The tenant's usage_days rows of the rolled days in [start, end), in day order."""
    query = (
        select(UsageDay)
        .where(UsageDay.tenant_id == tenant_id, UsageDay.day >= start.date(), UsageDay.day < end.date())
        .order_by(UsageDay.day)
    )
    result = session.scalars(query, execution_options={"yield_per": NUM_STREAMED_ROWS})
    try:
        for r in result:
            yield DaySum(r.day.isoformat(), r.model_name, r.base_model_name, r.status, r.num_requests,
                         r.prompt_tokens, r.completion_tokens, as_utc(r.first_started_at))  # fmt: skip
    finally:
        result.close()


def _raw_sums(session: Session, tenant_id: str, start: datetime, end: datetime) -> Iterator[DaySum]:
    """The same sums as usage_days holds, of the tenant's raw rows in [start, end) (within one UTC day)."""
    keys = [UsageRecord.model_name, ROW_BASE_MODEL, UsageRecord.status]
    query = (
        select(*keys, *DAY_SUM_COLUMNS)
        .where(
            UsageRecord.tenant_id == tenant_id, UsageRecord.started_at >= start, UsageRecord.started_at < end
        )
        .group_by(*keys)
    )
    day = start.astimezone(UTC).date().isoformat()
    for row in session.execute(query):
        model, base_model, status, n, prompt, completion, first = tuple(row)
        first_at = first if isinstance(first, datetime) else datetime.fromisoformat(str(first))
        yield DaySum(day, model, base_model, status, int(n), int(prompt), int(completion), as_utc(first_at))


def _group(day: str, model: str, rows: list[DaySum]) -> dict[str, object]:
    """One (day, model) group from its sums (by first_started_at): requests, tokens, requests by status."""
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r.status] = by_status.get(r.status, 0) + r.num_requests
    return {
        "day": day,
        "model": model,
        "base_model": rows[0].base_model or None,
        "num_requests": sum(r.num_requests for r in rows),
        "prompt_tokens": sum(r.prompt_tokens for r in rows),
        "completion_tokens": sum(r.completion_tokens for r in rows),
        "by_status": by_status,
    }


def usage_token_totals(session: Session, tenant_id: str, start: datetime, end: datetime) -> tuple[int, int]:
    """The tenant's prompt and completion tokens in [start, end) (all pages together)."""
    sums = usage_sums(session, start, end, by_tenant=False, tenant_id=tenant_id).values()
    return sum(s.prompt_tokens for s in sums), sum(s.completion_tokens for s in sums)
