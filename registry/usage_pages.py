"""Pages of a tenant's usage per (UTC day, model) (GET /v1/usage): keyset pagination over the groups.

A group's id is `<day>:<model>` (`2026-11-01:my-adapter`; the day comes first and has no ':', so a model name
with ':' in it still parses), and groups are in (day, model) order, so the cursor (`after`, the last id of the
previous page) is a position: the page reads from the start of the cursor's day on, day by day, and stops at
the first day boundary past limit + 1 groups. A day the daily rollup holds (registry/usage_rollup.py) is read
from its sums in usage_days (a few rows per model); any other day from the tenant's raw rows in started_at order
(ix_usage_records_tenant_started). A page thus costs the days it shows, whatever page it is. A cursor reads only the
calling tenant's rows, so it tells nothing about anyone else's; a cursor that is not of that shape is an
InvalidCursorError.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.models import UsageDay, UsageRecord
from registry.pages import Page, PageRequest, invalid_cursor, split_page
from registry.usage_days import Marks, read_stably, segments, usage_sums
from registry.usage_reports import UsageRow, to_usage_row, usage_by_adapter_day, usage_rows_query

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


def _groups_after(
    session: Session,
    tenant_id: str,
    start: datetime,
    end: datetime,
    marks: Marks,
    position: GroupKey | None,
    limit: int,
) -> list[dict[str, object]]:
    """The first groups after `position` in [start, end), more than `limit` of them when there are."""
    groups: list[dict[str, object]] = []
    for part_start, part_end, is_rolled in segments(start, end, marks):
        if len(groups) > limit:
            break
        if is_rolled:
            groups += _rolled_groups_after(
                session, tenant_id, part_start, part_end, position, limit + 1 - len(groups)
            )
        else:
            rows = _rows_of_groups_after(
                session, tenant_id, part_start, part_end, position, limit - len(groups)
            )
            groups += usage_by_adapter_day(rows)
    return groups


def _rolled_groups_after(
    session: Session,
    tenant_id: str,
    start: datetime,
    end: datetime,
    position: GroupKey | None,
    num_groups: int,
) -> list[dict[str, object]]:
    """The groups after `position` of the rolled days in [start, end), from usage_days: whole days, until at
    least num_groups (models are ordered here, as the raw rows' groups are, not by the database's collation)."""
    query = (
        select(UsageDay)
        .where(UsageDay.tenant_id == tenant_id, UsageDay.day >= start.date(), UsageDay.day < end.date())
        .order_by(UsageDay.day)
    )
    groups: dict[GroupKey, list[UsageDay]] = {}
    day = None
    result = session.scalars(query, execution_options={"yield_per": NUM_STREAMED_ROWS})
    try:
        for row in result:
            key = (row.day.isoformat(), row.model_name)
            if key[0] != day:
                if len(groups) >= num_groups:  # every group so far is of an earlier, complete day
                    break
                day = key[0]
            if position is None or key > position:
                groups.setdefault(key, []).append(row)
    finally:
        result.close()
    return [
        _rolled_group(day, model, sorted(rows, key=lambda r: r.first_started_at))
        for (day, model), rows in sorted(groups.items())
    ]


def _rolled_group(day: str, model: str, rows: list[UsageDay]) -> dict[str, object]:
    """One (day, model) group from its rollup rows (by first_started_at), in usage_by_adapter_day's shape."""
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r.status] = by_status.get(r.status, 0) + r.num_requests
    return {
        "day": day,
        "model": model,
        "base_model": rows[0].base_model_name or None,
        "num_requests": sum(r.num_requests for r in rows),
        "prompt_tokens": sum(r.prompt_tokens for r in rows),
        "completion_tokens": sum(r.completion_tokens for r in rows),
        "by_status": by_status,
    }


def _rows_of_groups_after(
    session: Session, tenant_id: str, start: datetime, end: datetime, position: GroupKey | None, limit: int
) -> list[UsageRow]:
    """The rows of the first groups after `position`: whole days, until more than `limit` groups are complete."""
    query = usage_rows_query(start, end, tenant_id).order_by(UsageRecord.started_at)
    result = session.execute(query, execution_options={"yield_per": NUM_STREAMED_ROWS})
    groups: dict[GroupKey, list[UsageRow]] = {}
    day = None
    try:
        for raw in result:
            row = to_usage_row(raw)
            key = (row.started_at.date().isoformat(), row.model_name)
            if key[0] != day:
                if len(groups) > limit:  # every group so far is of an earlier, complete day
                    break
                day = key[0]
            if position is None or key > position:
                groups.setdefault(key, []).append(row)
    finally:
        result.close()
    return [row for group in groups.values() for row in group]


def usage_token_totals(session: Session, tenant_id: str, start: datetime, end: datetime) -> tuple[int, int]:
    """The tenant's prompt and completion tokens in [start, end) (all pages together)."""
    sums = usage_sums(session, start, end, by_tenant=False, tenant_id=tenant_id).values()
    return sum(s.prompt_tokens for s in sums), sum(s.completion_tokens for s in sums)
