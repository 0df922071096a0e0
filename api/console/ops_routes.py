"""The operator's serving pages: workers (resident adapters, pool pages by use, queues), the placement table
and scaling state (desired vs live workers over time), the length predictor's accuracy, and the capacity
planner's what-if. Each calls the actions the REST admin routes call (api/actions/placement.py, predictor.py,
plan_jobs.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api.actions import placement, plan_jobs, predictor
from api.console.auth import ConsoleOperator, CsrfChecked
from api.console.charts import chart, series_by
from api.console.security import ConsoleRoute
from api.console.templating import render
from api.deps import ServicesDep, SessionDep
from api.errors import ApiError
from api.live_workers import live_workers
from api.report_schemas import PlanRequest
from api.scaling_history import ScalingSample
from registry.repository import version_labels

router = APIRouter(prefix="/console/admin", route_class=ConsoleRoute, include_in_schema=False)
PLAN_FORM_FIELDS = ("window_s", "slo", "profile", "objective", "num_samples", "check_s")


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(
    request: Request, user: ConsoleOperator, db: SessionDep, services: ServicesDep
) -> Response:
    """Live workers: readiness, queues, pool pages by use and resident adapters (device and host)."""
    workers = await run_in_threadpool(live_workers, services.worker_directory, services.worker_listing)
    ids = {a for w in workers for a in (*w.scheduler.device_adapters, *w.host_adapters)}
    labels = await run_in_threadpool(version_labels, db, ids)
    pages = chart(
        "bar",
        [w.worker_id for w in workers],
        {
            "KV pages": [w.scheduler.num_kv_pages_used for w in workers],
            "adapter pages": [w.scheduler.num_adapter_pages for w in workers],
            "free pages": [w.scheduler.num_free_pool_pages for w in workers],
        },
        title="Pool pages by use",
        y_title="pages",
        is_stacked=True,
    )
    return render(request, "admin_workers.html", user, workers=workers, labels=labels, pages=pages)


@router.get("/placement", response_class=HTMLResponse)
async def placement_page(
    request: Request, user: ConsoleOperator, db: SessionDep, services: ServicesDep
) -> Response:
    """The routing table, the workers' planned load, and desired vs live workers per base model over time."""
    report = await run_in_threadpool(placement.placement_report, services)
    scaling = await run_in_threadpool(placement.scaling_report, services)
    labels = await run_in_threadpool(version_labels, db, report.table)
    history = _scaling_chart(services.scaling.history.samples())
    return render(
        request, "admin_placement.html", user, report=report, scaling=scaling, labels=labels, history=history
    )


def _scaling_chart(samples: list[ScalingSample]) -> dict[str, Any]:
    def at(sample: ScalingSample) -> str:
        return datetime.fromtimestamp(sample.at_s, tz=UTC).strftime("%H:%M:%S")

    desired = series_by(samples, at, lambda s: f"{s.base_model} desired", lambda s: s.desired_workers)
    live = series_by(samples, at, lambda s: f"{s.base_model} live", lambda s: s.live_workers)
    return chart("line", desired[0], desired[1] | live[1], title="Desired vs live workers", y_title="workers")


@router.get("/predictor", response_class=HTMLResponse)
async def predictor_page(
    request: Request, user: ConsoleOperator, db: SessionDep, services: ServicesDep, window_s: float = 86400.0
) -> Response:
    """The served length predictor and its accuracy on the recorded requests of the window."""
    error = None
    try:
        report = await run_in_threadpool(predictor.predictor_report, db, services, window_s)
    except ApiError as exc:
        error, report = exc.message, await run_in_threadpool(predictor.predictor_report, db, services)
    recall = chart(
        "bar",
        [f"≤{edge}" for edge in report.bucket_edges] + [f">{report.bucket_edges[-1]}"],
        {"recall": list(report.overall.bucket_recall)},
        title="Recall per output-length bucket",
        y_title="share",
        y_max=1.0,
    )
    return render(request, "admin_predictor.html", user, report=report, recall=recall, error=error)


@router.get("/planner", response_class=HTMLResponse)
def planner_page(request: Request, user: ConsoleOperator, services: ServicesDep) -> Response:
    """The capacity planner's what-if form."""
    return render(
        request,
        "admin_planner.html",
        user,
        defaults=PlanRequest(),
        profile=services.settings.placement.planner_profile,
    )


@router.post("/planner", response_class=HTMLResponse)
async def run_planner(
    request: Request, _: CsrfChecked, user: ConsoleOperator, db: SessionDep, services: ServicesDep
) -> Response:
    """Queue a plan of the recorded demand within the SLO (POST /v1/admin/plan); the job fragment, which polls
    itself until the plan is done."""
    form = await request.form()
    values = {k: v for k, v in form.items() if k in PLAN_FORM_FIELDS and v != ""}
    try:
        body = PlanRequest.model_validate(values)
        job = await run_in_threadpool(plan_jobs.submit_plan, body, services, db)
    except ValidationError as exc:
        return render(request, "admin_plan_result.html", user, 400, error=str(exc.errors()[0]["msg"]))
    except ApiError as exc:
        return render(request, "admin_plan_result.html", user, exc.status_code, error=exc.message)
    return render(request, "admin_plan_job.html", user, job=plan_jobs.plan_job_public(job))


@router.get("/planner/jobs/{job_id}", response_class=HTMLResponse)
async def planner_job(request: Request, job_id: str, user: ConsoleOperator, db: SessionDep) -> Response:
    """The plan job's fragment: progress while it waits or runs (htmx polls it), then the plan or the reason."""
    try:
        job = await run_in_threadpool(plan_jobs.get_plan, job_id, db)
    except ApiError as exc:
        return render(request, "admin_plan_result.html", user, exc.status_code, error=exc.message)
    return render(request, "admin_plan_job.html", user, job=plan_jobs.plan_job_public(job))


@router.post("/planner/jobs/{job_id}/cancel", response_class=HTMLResponse)
async def cancel_planner_job(
    request: Request,
    job_id: str,
    _: CsrfChecked,
    user: ConsoleOperator,
    db: SessionDep,
    services: ServicesDep,
) -> Response:
    """Cancel the plan job (DELETE /v1/admin/plan/{id}); its fragment."""
    try:
        job = await run_in_threadpool(plan_jobs.cancel_plan, job_id, services, db)
    except ApiError as exc:
        return render(request, "admin_plan_result.html", user, exc.status_code, error=exc.message)
    return render(request, "admin_plan_job.html", user, job=plan_jobs.plan_job_public(job))
