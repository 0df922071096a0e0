"""Capacity-plan jobs: the planner (twin/planner/) on recorded demand (usage rows over a window,
registry/plan_demand.py) or on a given workload, with a twin profile, run as a JOB out of the request path
(jobs/plan_runner.py). Submitting checks everything in the request (a bad profile name, SLO or workload, or no
recorded demand: 400 saying what to fix) and refuses with 429 when settings.placement.planner_max_running +
planner_max_queued jobs are queued or running. /v1/admin/plan and the console's planner page call these.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from api.errors import ApiError
from api.report_schemas import PlanRequest
from api.services import Services
from jobs.plan_runner import queued_deadline_s
from registry.models import PlanJob
from registry.plan_demand import read_plan_demand
from registry.plan_jobs import (
    count_active_plan_jobs,
    create_plan_job,
    delete_plan_job,
    finish_plan_job,
    get_plan_job,
)
from twin.planner.plan_inputs import plan_inputs, search_inputs
from twin.planner.profile_lookup import resolve_profile_name
from twin.planner.recorded_demand import workload_from_usage
from twin.planner.slo import parse_slo
from twin.planner.workload import Workload, workload_from_dict
from twin.profile import ProfileError

RETRY_AFTER_S = 30  # the Retry-After of a 429: plans take seconds to minutes


def get_plan(job_id: str, session: Session) -> PlanJob:
    """The job; 404 for an unknown id."""
    return _job_or_404(session, job_id)


def submit_plan(body: PlanRequest, services: Services, session: Session) -> PlanJob:
    """Check the request (400 saying what to fix), then create and queue the job (429 when the queue is full)."""
    settings = services.settings
    inputs = _checked_inputs(body, services, session)
    max_jobs = settings.placement.planner_max_running + settings.placement.planner_max_queued
    if count_active_plan_jobs(session) >= max_jobs:
        raise _queue_full(max_jobs)
    owner = settings.api.resolved_api_instance_id()
    job = create_plan_job(session, inputs, services.plan_runner.name, owner, queued_deadline_s(settings))
    if not services.plan_runner.submit(job.id, inputs):
        delete_plan_job(session, job.id)
        raise _queue_full(max_jobs)
    return job


def cancel_plan(job_id: str, services: Services, session: Session) -> PlanJob:
    """Write `cancelled` (unless the job has ended) and stop its run; the job as it is now. 404 if unknown."""
    _job_or_404(session, job_id)
    if finish_plan_job(session, job_id, "cancelled", error="cancelled by the operator"):
        services.plan_runner.cancel(job_id)
    return _job_or_404(session, job_id)


def plan_job_public(job: PlanJob) -> dict[str, Any]:
    """The job as the API shows it: status, times, and the plan (`result`) or the reason (`error`)."""
    return {
        "object": "capacity_plan_job",
        "id": job.id,
        "status": job.status,
        "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "result": job.result,
        "error": job.error,
    }


def _checked_inputs(body: PlanRequest, services: Services, session: Session) -> dict[str, Any]:
    settings = services.settings
    try:
        profile = resolve_profile_name(body.profile, settings.placement.planner_profile)
        slo = parse_slo(body.slo) if body.slo else None
        workload = _workload(session, body)
    except (ProfileError, ValueError) as exc:
        raise ApiError(400, "invalid_request_error", str(exc)) from None
    return plan_inputs(
        workload, profile, slo, objective=body.objective, form=body.form, check_s=body.check_s,
        num_samples=body.num_samples, with_baselines=body.baselines,
        window_s=None if body.workload else body.window_s, max_lora_rank=settings.resolved_max_lora_rank(),
        search=search_inputs(
            settings.placement.planner_search_max_checks if body.max_checks is None else body.max_checks,
            settings.placement.planner_search_max_s if body.max_search_s is None else body.max_search_s,
            body.gpu_price_per_hour,
        ),
    )  # fmt: skip


def _workload(session: Session, body: PlanRequest) -> Workload:
    if body.workload is not None:
        return workload_from_dict(body.workload, "workload")
    samples = read_plan_demand(session, datetime.now(UTC), body.window_s)
    return workload_from_usage(samples, body.window_s)


def _job_or_404(session: Session, job_id: str) -> PlanJob:
    job = get_plan_job(session, job_id)
    if job is None:
        raise ApiError(404, "not_found", f"no capacity plan job {job_id!r}: POST /v1/admin/plan starts one")
    return job


def _queue_full(max_jobs: int) -> ApiError:
    return ApiError(
        429,
        "rate_limited",
        f"{max_jobs} capacity plans are queued or running, the most the server takes "
        "(LORAHOST_PLACEMENT_PLANNER_MAX_RUNNING + LORAHOST_PLACEMENT_PLANNER_MAX_QUEUED): wait for one to finish "
        "(GET /v1/admin/plan/{id}) or cancel one (DELETE /v1/admin/plan/{id}), then submit again",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )
