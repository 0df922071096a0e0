"""Capacity-plan jobs (admin key only): the planner (twin/planner/) on recorded demand (usage rows over a
window, registry/plan_demand.py) or on a given workload, with a twin profile, run as a JOB out of the request
path (jobs/plan_runner.py: a low-priority child process in embedded mode, a Celery task otherwise). The work:
api/actions/plan_jobs.py.

POST /v1/admin/plan checks everything in the request (a bad profile name, SLO or workload, or no recorded
demand: 400 saying what to fix; a malformed body: 422), stores the resolved inputs on a job row and answers
202 with the job (Location: its URL); 429 when settings.placement.planner_max_running +
planner_max_queued jobs are queued or running. GET /v1/admin/plan/{id} is the job: status queued | running |
succeeded | failed | cancelled, with `result` (`lorahost plan --json`'s answer with object and window_s)
once it succeeded, `error` once it failed. DELETE cancels it (its process is killed; idempotent). The
`profile` field takes profile names only (shipped ones and the operator's configured one), never a path.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api.actions import plan_jobs
from api.deps import AdminDep, ServicesDep, SessionDep
from api.report_schemas import PlanRequest
from api.request_text import TextCheckedRoute

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=TextCheckedRoute)


@router.post("/plan", status_code=202)
def create_capacity_plan(
    body: PlanRequest, _: AdminDep, services: ServicesDep, session: SessionDep
) -> JSONResponse:
    """Queue a plan of the recorded demand (or `workload`) and its twin check (module doc): 202 + the job."""
    job = plan_jobs.submit_plan(body, services, session)
    return JSONResponse(
        plan_jobs.plan_job_public(job), status_code=202, headers={"Location": f"/v1/admin/plan/{job.id}"}
    )


@router.get("/plan/{job_id}")
async def get_capacity_plan(job_id: str, _: AdminDep, session: SessionDep) -> dict[str, Any]:
    """The job: its status, and the plan (`result`) once it succeeded or the reason (`error`) once it failed."""
    job = await run_in_threadpool(plan_jobs.get_plan, job_id, session)
    return plan_jobs.plan_job_public(job)


@router.delete("/plan/{job_id}")
def cancel_capacity_plan(
    job_id: str, _: AdminDep, services: ServicesDep, session: SessionDep
) -> dict[str, Any]:
    """Cancel the job (a queued one never runs, a running one's process is killed); a finished job is left
    as it is. Idempotent; 404 for an unknown id."""
    return plan_jobs.plan_job_public(plan_jobs.cancel_plan(job_id, services, session))
