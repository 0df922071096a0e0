"""/v1/admin/billing and /v1/admin/slo: the operator's reports over the usage ledger (admin key only). The
work: api/actions/reports.py."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.actions import reports
from api.csv_download import csv_download
from api.deps import AdminDep, SessionDep
from api.json_body import json_response_in_thread
from api.query_dates import parse_period
from api.request_text import TextCheckedRoute

router = APIRouter(prefix="/v1/admin", tags=["reports"], route_class=TextCheckedRoute)


@router.get("/billing", response_model=None)
async def get_billing(
    _: AdminDep, session: SessionDep, start: str | None = None, end: str | None = None, format: str = "json"
) -> Response:
    """Invoice lines per tenant for [start, end) (default: the last 30 days); `format=csv` for text/csv."""
    reports.check_billing_format(format)
    lo, hi = parse_period(start, end)
    if format == "csv":
        return csv_download(await run_in_threadpool(reports.billing_csv, session, lo, hi))
    return await json_response_in_thread(lambda: reports.billing(session, lo, hi))


@router.get("/slo", response_model=None)
async def get_slo(
    _: AdminDep,
    session: SessionDep,
    start: str | None = None,
    end: str | None = None,
    group_by: str = "tenant",
) -> Response:
    """TTFT/TPOT/E2E p50/p90/p99 (ms), SLO attainment, counts and error rate per tenant, adapter or hour."""
    reports.check_slo_group_by(group_by)
    lo, hi = parse_period(start, end)
    return await json_response_in_thread(lambda: reports.slo(session, lo, hi, group_by))
