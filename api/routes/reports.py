"""/v1/admin/billing and /v1/admin/slo: the operator's reports over the usage ledger (admin key only)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.deps import AdminDep, SessionDep
from api.errors import ApiError
from api.query_dates import parse_period
from api.request_text import TextCheckedRoute
from registry.billing import billing_report, invoice_to_json, invoices_to_csv
from registry.usage import GROUP_BYS
from registry.usage_reports import slo_report

router = APIRouter(prefix="/v1/admin", tags=["reports"], route_class=TextCheckedRoute)
BILLING_FORMATS = ("json", "csv")


@router.get("/billing", response_model=None)
async def get_billing(
    _: AdminDep, session: SessionDep, start: str | None = None, end: str | None = None, format: str = "json"
) -> dict[str, Any] | Response:
    """Invoice lines per tenant for [start, end) (default: the last 30 days); `format=csv` for text/csv."""
    if format not in BILLING_FORMATS:
        raise ApiError(
            400, "invalid_request", f"format must be one of {', '.join(BILLING_FORMATS)}, not {format!r}"
        )
    lo, hi = parse_period(start, end)
    lines = await run_in_threadpool(billing_report, session, lo, hi)
    if format == "csv":
        filename = f"billing_{lo:%Y%m%d}_{hi:%Y%m%d}.csv"
        return Response(
            invoices_to_csv(lines),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )
    return {
        "object": "list",
        "start": lo.isoformat(),
        "end": hi.isoformat(),
        "data": [invoice_to_json(line) for line in lines],
    }


@router.get("/slo")
async def get_slo(
    _: AdminDep,
    session: SessionDep,
    start: str | None = None,
    end: str | None = None,
    group_by: str = "tenant",
) -> dict[str, Any]:
    """TTFT/TPOT/E2E p50/p90/p99 (ms), SLO attainment, counts and error rate per tenant, adapter or hour."""
    if group_by not in GROUP_BYS:
        raise ApiError(
            400, "invalid_request", f"group_by must be one of {', '.join(GROUP_BYS)}, not {group_by!r}"
        )
    lo, hi = parse_period(start, end)
    groups = await run_in_threadpool(slo_report, session, lo, hi, group_by)
    return {
        "object": "list",
        "start": lo.isoformat(),
        "end": hi.isoformat(),
        "group_by": group_by,
        "data": [asdict(g) for g in groups],
    }
