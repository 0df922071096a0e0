"""Pages of a tenant's usage per (UTC day, model) (GET /v1/usage): keyset pagination over the groups.

A group's id is `<day>:<model>` (`2026-11-01:my-adapter`; the day comes first and has no ':', so a model name
with ':' in it still parses), and groups are in (day, model) order, so the cursor (`after`, the last id of the
previous page) is a position: the page reads the tenant's rows from the start of the cursor's day in
started_at order (ix_usage_records_tenant_started), groups them, and stops at the first day boundary past
limit + 1 groups. A page thus costs the rows of the days it shows, whatever page it is. A cursor reads only the
calling tenant's rows, so it tells nothing about anyone else's; a cursor that is not of that shape is an
InvalidCursorError.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.models import UsageRecord
from registry.pages import Page, PageRequest, invalid_cursor, split_page
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
    each with its `id`."""
    position = None if page.after is None else parse_usage_cursor(page.after)
    first = start if position is None else max(start, datetime.fromisoformat(position[0]).replace(tzinfo=UTC))
    rows = _rows_of_groups_after(session, tenant_id, first, end, position, page.limit)
    data = usage_by_adapter_day(rows)
    for group in data:
        group["id"] = usage_group_id(str(group["day"]), str(group["model"]))
    return split_page(data, page.limit)


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
    query = select(
        func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
        func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
    ).where(UsageRecord.tenant_id == tenant_id, UsageRecord.started_at >= start, UsageRecord.started_at < end)
    prompt, completion = session.execute(query).one()
    return int(prompt), int(completion)
