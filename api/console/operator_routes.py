"""The operator's business pages: tenants and plans (create, enable/disable, key management, issue a key), billing
by period with CSV download, and SLO attainment and latency percentiles over time by tenant, adapter or base
model. Changes go through the admin actions (api/actions/tenants.py) as /v1/admin does, so the console applies the
same validation and cache invalidation."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api.actions import reports, tenants
from api.console.auth import ConsoleOperator, ConsoleUser, CsrfChecked
from api.console.charts import chart, series_by
from api.console.pager import console_page_request, pager
from api.console.periods import read_period
from api.console.security import ConsoleRoute
from api.console.templating import render
from api.csv_download import csv_download
from api.deps import ServicesDep, SessionDep
from api.errors import registry_status
from api.query_dates import parse_period
from api.schemas import PricePlanCreate, TenantCreate, TenantUpdate
from registry import repository
from registry.account_pages import tenant_page
from registry.billing import billing_report
from registry.errors import RegistryError
from registry.usage_series import (
    BUCKETS,
    MAX_SERIES_GROUPS,
    OTHER_GROUP,
    SERIES_GROUP_BYS,
    SloPoint,
    slo_series,
)

router = APIRouter(prefix="/console/admin", route_class=ConsoleRoute, include_in_schema=False)
PLAN_FIELDS = tuple(PricePlanCreate.model_fields)


def _tenants_page(
    request: Request, user: ConsoleUser, db: SessionDep, *, message: str | None = None,
    error: str | None = None, new_key: tuple[str, str] | None = None, status_code: int = 200,
    after: str | None = None,
) -> Response:  # fmt: skip
    wanted = console_page_request(after)
    page = tenant_page(db, wanted)
    plans = repository.list_price_plans(db)
    return render(
        request, "admin_tenants.html", user, status_code, tenants=page.items, plans=plans, message=message,
        error=error, new_key=new_key, plan_fields=PLAN_FIELDS, **pager(page, wanted),
    )  # fmt: skip


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return getattr(exc, "message", None) or str(exc)


@router.get("/tenants", response_class=HTMLResponse)
def tenants_page(
    request: Request, user: ConsoleOperator, db: SessionDep, after: str | None = None
) -> Response:
    """Tenants with their plan, state and key policy, oldest first, a page at a time; the price plans."""
    return _tenants_page(request, user, db, after=after)


@router.post("/tenants", response_class=HTMLResponse)
def create_tenant(
    request: Request, _: CsrfChecked, user: ConsoleOperator, db: SessionDep,
    name: str = Form(""), plan_id: str = Form(""),
) -> Response:  # fmt: skip
    """Create a tenant (POST /v1/admin/tenants)."""
    try:
        tenant = tenants.create_tenant(TenantCreate(name=name, plan_id=plan_id or None), db)
    except (ValidationError, RegistryError) as exc:
        return _tenants_page(request, user, db, error=_error_text(exc), status_code=400)
    return _tenants_page(request, user, db, message=f"created tenant {tenant.name} ({tenant.id})")


@router.post("/tenants/{tenant_id}", response_class=HTMLResponse)
async def update_tenant(
    tenant_id: str,
    request: Request,
    _: CsrfChecked,
    user: ConsoleOperator,
    db: SessionDep,
    services: ServicesDep,
) -> Response:
    """Change a tenant (PATCH /v1/admin/tenants/{id}): the form sends the fields to change."""
    form = await request.form()
    changes: dict[str, Any] = {}
    for flag in ("is_active", "can_manage_keys"):
        if flag in form:
            changes[flag] = form[flag] == "true"
    if "plan_id" in form:
        changes["plan_id"] = form["plan_id"] or None
    try:
        body = TenantUpdate(**changes)
        tenant = await run_in_threadpool(tenants.update_tenant, tenant_id, body, db, services)
    except (ValidationError, RegistryError) as exc:
        return _tenants_page(request, user, db, error=_error_text(exc), status_code=400)
    return _tenants_page(request, user, db, message=f"updated tenant {tenant.name}")


@router.post("/tenants/{tenant_id}/keys", response_class=HTMLResponse)
def create_key(
    tenant_id: str,
    request: Request,
    _: CsrfChecked,
    user: ConsoleOperator,
    db: SessionDep,
    services: ServicesDep,
) -> Response:
    """Issue a key for a tenant (POST /v1/admin/tenants/{id}/keys); shown once. A missing tenant is a 404, a
    tenant at its key limit a 409 with the API's message."""
    try:
        created = tenants.create_tenant_key(tenant_id, db, services)
    except RegistryError as exc:
        return _tenants_page(request, user, db, error=_error_text(exc), status_code=registry_status(exc))
    return _tenants_page(request, user, db, new_key=(tenant_id, created.key))


@router.post("/plans", response_class=HTMLResponse)
async def create_plan(request: Request, _: CsrfChecked, user: ConsoleOperator, db: SessionDep) -> Response:
    """Create a price plan (POST /v1/admin/plans) from the form's non-empty fields."""
    form = await request.form()
    values = {k: v for k, v in form.items() if k in PLAN_FIELDS and v != ""}
    try:
        plan = tenants.create_plan(PricePlanCreate.model_validate(values), db)
    except (ValidationError, RegistryError) as exc:
        return _tenants_page(request, user, db, error=_error_text(exc), status_code=400)
    return _tenants_page(request, user, db, message=f"created plan {plan.name}")


@router.get("/billing", response_class=HTMLResponse)
async def billing_page(
    request: Request, user: ConsoleOperator, db: SessionDep, start: str | None = None, end: str | None = None
) -> Response:
    """Invoice lines per tenant and base model for the period, with the CSV download."""
    period = read_period(start, end)
    lines = await run_in_threadpool(billing_report, db, period.start, period.end)
    total = sum((line.total for line in lines), start=type(lines[0].total)(0)) if lines else None
    return render(request, "admin_billing.html", user, period=period, lines=lines, total=total)


@router.get("/billing.csv")
async def billing_csv(
    user: ConsoleOperator, db: SessionDep, start: str | None = None, end: str | None = None
) -> Response:
    """The period's invoice lines as CSV (GET /v1/admin/billing?format=csv)."""
    lo, hi = parse_period(start, end)
    return csv_download(await run_in_threadpool(reports.billing_csv, db, lo, hi))


@router.get("/slo", response_class=HTMLResponse)
async def slo_page(
    request: Request, user: ConsoleOperator, db: SessionDep, start: str | None = None, end: str | None = None,
    group_by: str = "tenant", bucket: str = "hour",
) -> Response:  # fmt: skip
    """SLO attainment and TTFT/TPOT percentiles per hour or day, by tenant, adapter or base model."""
    group_by = group_by if group_by in SERIES_GROUP_BYS else "tenant"
    bucket = bucket if bucket in BUCKETS else "hour"
    period = read_period(start, end)
    points = await run_in_threadpool(slo_series, db, period.start, period.end, group_by, bucket)
    names = {t.id: t.name for t in repository.list_tenants(db)} if group_by == "tenant" else {}
    return render(
        request, "admin_slo.html", user, period=period, points=points, group_by=group_by, bucket=bucket,
        group_bys=SERIES_GROUP_BYS, buckets=BUCKETS, names=names, charts=_slo_charts(points, names),
        has_other=any(p.slo.key == OTHER_GROUP for p in points), max_groups=MAX_SERIES_GROUPS,
    )  # fmt: skip


def _slo_charts(points: list[SloPoint], names: dict[str, str]) -> list[dict[str, Any]]:
    def by_group(value_of: Any) -> tuple[list[str], dict[str, list[Any]]]:
        return series_by(points, lambda p: p.bucket, lambda p: names.get(p.slo.key, p.slo.key), value_of)

    return [
        chart(
            "line", *by_group(lambda p: p.slo.attainment), title="SLO attainment", y_title="share", y_max=1.0
        ),
        chart("line", *by_group(lambda p: p.slo.ttft_p50), title="TTFT p50", y_title="ms"),
        chart("line", *by_group(lambda p: p.slo.ttft_p99), title="TTFT p99", y_title="ms"),
        chart("line", *by_group(lambda p: p.slo.tpot_p50), title="TPOT p50", y_title="ms"),
        chart("line", *by_group(lambda p: p.slo.tpot_p99), title="TPOT p99", y_title="ms"),
    ]
