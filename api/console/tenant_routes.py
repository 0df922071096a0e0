"""A tenant's pages: adapters (versions, status, failure reasons, residency, cold starts), upload, usage with
charts, and API keys when the operator allows it. Every query is scoped to the signed-in tenant's id, as in
the REST routes; another tenant's adapter is a 404 like one that does not exist."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.actions import adapters
from api.actions.usage import tenant_usage_csv
from api.console.auth import ConsoleTenant, CsrfChecked, tenant_row
from api.console.charts import chart, series_by
from api.console.pager import console_page_request, pager
from api.console.periods import read_period
from api.console.residency import VersionResidency, version_residency
from api.console.security import ConsoleRoute
from api.console.templating import render
from api.csv_download import csv_download
from api.deps import ServicesDep, SessionDep
from api.live_workers import live_workers
from api.query_dates import parse_period
from api.schemas import AdapterPublic
from api.services import Services
from api.upload_request import upload_from_request
from registry import repository
from registry.adapter_pages import own_adapter_page
from registry.base_model_catalog import list_base_models
from registry.errors import NotFoundError
from registry.models import Adapter
from registry.usage_series import UsagePoint, tenant_usage_series, total_cost

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)


def _adapters_with_residency(
    services: Services, tenant_id: str, own: list[Adapter]
) -> list[tuple[AdapterPublic, dict[str, VersionResidency]]]:
    workers = live_workers(services.worker_directory, services.worker_listing)
    rows = []
    for adapter in own:
        public = AdapterPublic.from_row(adapter, viewer_tenant_id=tenant_id)
        where = {v.id: version_residency(workers, v.id, v.status == "ready") for v in public.versions}
        rows.append((public, where))
    return rows


@router.get("/adapters", response_class=HTMLResponse)
def adapters_page(
    request: Request, user: ConsoleTenant, db: SessionDep, services: ServicesDep, after: str | None = None
) -> Response:
    """The tenant's adapters by name, a page at a time, with their versions and where each is, and the upload drop
    zone."""
    wanted = console_page_request(after)
    page = own_adapter_page(db, user.tenant_id or "", wanted)
    rows = _adapters_with_residency(services, user.tenant_id or "", page.items)
    base_models = served_base_models(services, db)
    return render(request, "adapters.html", user, rows=rows, base_models=base_models, **pager(page, wanted))


@router.get("/adapters/{name}", response_class=HTMLResponse)
def adapter_page(
    name: str, request: Request, user: ConsoleTenant, db: SessionDep, services: ServicesDep
) -> Response:
    """One adapter: versions, status and failure reasons, residency (polled while a version validates)."""
    own = repository.get_own_adapter(db, user.tenant_id or "", name)
    if own is None:
        raise NotFoundError(f"you have no adapter named {name!r}")
    [(adapter, where)] = _adapters_with_residency(services, user.tenant_id or "", [own])
    template = "adapter_versions.html" if request.headers.get("HX-Request") else "adapter.html"
    is_settling = any(v.status == "validating" for v in adapter.versions)
    return render(request, template, user, adapter=adapter, where=where, is_settling=is_settling)


@router.post("/adapters")
async def upload(
    request: Request, _: CsrfChecked, user: ConsoleTenant, db: SessionDep, services: ServicesDep
) -> Response:
    """The drop zone's upload (multipart: name, base_model, files) or the import form's JSON (name, base_model,
    source, hf_token): as POST /v1/adapters, for this tenant."""
    accepted = await upload_from_request(request, tenant_row(db, user), db, services)
    return JSONResponse(accepted.model_dump(mode="json"), status_code=202)


@router.post("/adapters/{name}/delete")
def delete(
    name: str, _: CsrfChecked, user: ConsoleTenant, db: SessionDep, services: ServicesDep
) -> RedirectResponse:
    """Delete one of the tenant's adapters (DELETE /v1/adapters/{name}); back to the list."""
    adapters.delete_adapter(name, tenant_row(db, user).id, db, services)
    return RedirectResponse("/console/adapters", status_code=303)


@router.get("/usage", response_class=HTMLResponse)
async def usage_page(
    request: Request,
    user: ConsoleTenant,
    db: SessionDep,
    start: str | None = None,
    end: str | None = None,
    adapter: str | None = None,
) -> Response:
    """Usage per day and adapter: tokens, cost, TTFT/TPOT p50/p99 and SLO attainment, charted and tabled."""
    period = read_period(start, end)
    points = await run_in_threadpool(tenant_usage_series, db, user.tenant_id or "", period.start, period.end)
    models = sorted({p.model for p in points})
    chosen = adapter if adapter in models else (models[0] if models else None)
    return render(
        request, "usage.html", user, period=period, points=points, models=models, chosen=chosen,
        total_cost=total_cost(points), charts=_usage_charts(points, chosen),
    )  # fmt: skip


@router.get("/usage.csv")
async def usage_csv(
    user: ConsoleTenant, db: SessionDep, start: str | None = None, end: str | None = None
) -> Response:
    """The usage table of the period as CSV (a bad date: 400, as the REST reports answer)."""
    lo, hi = parse_period(start, end)
    return csv_download(await run_in_threadpool(tenant_usage_csv, db, user.tenant_id or "", lo, hi))


def _usage_charts(points: list[UsagePoint], chosen: str | None) -> list[dict[str, Any]]:
    def by_model(value_of: Any) -> tuple[list[str], dict[str, list[Any]]]:
        return series_by(points, lambda p: p.day, lambda p: p.model, value_of)

    tokens = by_model(lambda p: _tokens(p))
    cost = by_model(lambda p: float(p.token_cost))
    attainment = by_model(lambda p: p.slo.attainment)
    mine = [p for p in points if p.model == chosen]
    days = [p.day for p in mine]
    latency = {
        "TTFT p50": [p.slo.ttft_p50 for p in mine], "TTFT p99": [p.slo.ttft_p99 for p in mine],
        "TPOT p50": [p.slo.tpot_p50 for p in mine], "TPOT p99": [p.slo.tpot_p99 for p in mine],
    }  # fmt: skip
    return [
        chart("bar", *tokens, title="Tokens per day", y_title="tokens", is_stacked=True),
        chart("bar", *cost, title="Token cost per day", y_title="cost", is_stacked=True),
        chart("line", days, latency, title=f"Latency of {chosen or '–'}", y_title="ms"),
        chart("line", *attainment, title="SLO attainment", y_title="share of requests", y_max=1.0),
    ]


def _tokens(point: UsagePoint) -> int:
    return point.prompt_tokens + point.completion_tokens


def served_base_models(services: Services, db: Session) -> list[str]:
    """The base models an adapter can be uploaded for: the configured one and the catalog's live ones."""
    names = {m.name for m in list_base_models(db)} | {services.settings.base_model_name}
    return sorted(names)
