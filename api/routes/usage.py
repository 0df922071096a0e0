"""/v1/usage: the calling tenant's own usage per day and adapter (model name), from the usage ledger."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentTenant, SessionDep
from api.query_dates import parse_period
from api.request_text import TextCheckedRoute
from registry.usage_reports import load_rows, usage_by_adapter_day

router = APIRouter(prefix="/v1", tags=["usage"], route_class=TextCheckedRoute)


@router.get("/usage")
async def get_usage(
    tenant: CurrentTenant, session: SessionDep, start: str | None = None, end: str | None = None
) -> dict[str, Any]:
    """The tenant's requests and tokens per (day, model) in [start, end) (default: the last 30 days).

    Tokens are what is billed (registry/usage_reports.py): `interrupted` requests (the server crashed) count to their last
    checkpoint; requests still running count what they have delivered so far and show as `in_progress` in
    `by_status`.
    """
    lo, hi = parse_period(start, end)
    rows = await run_in_threadpool(load_rows, session, lo, hi, tenant.id)
    data = usage_by_adapter_day(rows)
    return {
        "object": "list",
        "start": lo.isoformat(),
        "end": hi.isoformat(),
        "total_prompt_tokens": sum(int(d["prompt_tokens"]) for d in data),  # type: ignore[call-overload]
        "total_completion_tokens": sum(int(d["completion_tokens"]) for d in data),  # type: ignore[call-overload]
        "data": data,
    }
