"""/v1/usage: the calling tenant's own usage per day and adapter (model name), from the usage ledger."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentTenant, SessionDep
from api.errors import ApiError
from registry.usage import as_utc
from registry.usage_reports import default_period, load_rows, usage_by_adapter_day

router = APIRouter(prefix="/v1", tags=["usage"])

DATE_FORMAT_HINT = "ISO 8601 in UTC, e.g. 2026-11-01 or 2026-11-01T10:00:00 (or with an offset, +00:00)"


def parse_moment(value: str | None, name: str) -> datetime | None:
    """An ISO 8601 date/datetime query value as aware UTC (naive = UTC), None when absent; 400 when bad."""
    if value is None or value == "":
        return None
    try:
        return as_utc(datetime.fromisoformat(value.replace("Z", "+00:00").replace(" ", "+")))
    except ValueError as exc:
        raise ApiError(
            400, "invalid_request", f"{name}={value!r} is not a date: use {DATE_FORMAT_HINT}"
        ) from exc


def parse_period(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    """[start, end) from query values; defaults to the last 30 days; 400 when start >= end."""
    default_start, default_end = default_period()
    lo = parse_moment(start, "start") or default_start
    hi = parse_moment(end, "end") or default_end
    if lo >= hi:
        raise ApiError(
            400, "invalid_request", f"start ({lo.isoformat()}) must be before end ({hi.isoformat()})"
        )
    return lo, hi


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
