"""/v1/usage: the calling tenant's own usage per day and adapter (model name), from the usage ledger. The work:
api/actions/usage.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api.actions.usage import tenant_usage
from api.deps import CurrentTenant, SessionDep
from api.pagination import PageDep
from api.query_dates import parse_period
from api.request_text import TextCheckedRoute

router = APIRouter(prefix="/v1", tags=["usage"], route_class=TextCheckedRoute)


@router.get("/usage")
async def get_usage(
    tenant: CurrentTenant,
    session: SessionDep,
    page: PageDep,
    start: str | None = None,
    end: str | None = None,
) -> dict[str, Any]:
    """The tenant's requests and tokens per (day, model) in [start, end) (default: the last 30 days), by day then
    model, a page at a time: `limit` (1-1000, default 100) and `after` (the previous page's `last_id`; a group's
    `id` is `<day>:<model>`). The totals are the whole period's, on every page.

    Tokens are what is billed (registry/usage_reports.py): `interrupted` requests (the server crashed) count to their last
    checkpoint; requests still running count what they have delivered so far and show as `in_progress` in
    `by_status`.
    """
    lo, hi = parse_period(start, end)
    return await run_in_threadpool(tenant_usage, session, tenant.id, lo, hi, page)
