"""The Celery side of a capacity-plan job: run the plan a job row holds in a child process and write the row.

The task (jobs/celery_app.py, named in jobs/task_names.py) calls `run_plan_job` with the job id. The plan runs
in a low-priority child process (jobs/plan_process.py) under settings.placement.planner_time_limit_s; while
it runs the row is read every few tenths of a second, and a row no longer `running` (the API wrote
`cancelled`, or it was taken for lost) kills the child. With settings.placement.planner_max_running plans
already running, the task answers BUSY and is retried later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.plan_process import PlanOutcome, run_plan_process
from jobs.plan_runner import planner_cache_dir, running_deadline_s
from registry.models import PlanJob
from registry.plan_jobs import claim_plan_job, finish_plan_job, plan_job_status

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from settings import Settings

BUSY = "busy"  # as many plans as allowed run already: retry the task later


def run_plan_job(session_factory: sessionmaker[Session], settings: Settings, job_id: str) -> str:
    """Run job `job_id` to its end; its final status (or BUSY, or "gone" for a job no longer queued)."""
    with session_factory() as session:
        claim = claim_plan_job(
            session, job_id, settings.placement.planner_max_running, running_deadline_s(settings)
        )
        if claim != "claimed":
            return BUSY if claim == "busy" else "gone"
        job = session.get(PlanJob, job_id)
        if job is None:
            return "gone"
        inputs = job.inputs

    def should_stop() -> bool:
        with session_factory() as session:
            return plan_job_status(session, job_id) != "running"

    try:
        outcome = run_plan_process(
            inputs, settings.engine, planner_cache_dir(settings), settings.placement.planner_time_limit_s,
            should_stop=should_stop,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - e.g. no process could be started: the row says why
        outcome = PlanOutcome("failed", error=f"the plan could not run: {type(exc).__name__}: {exc}")
    with session_factory() as session:
        finish_plan_job(session, job_id, outcome.status, result=outcome.result, error=outcome.error)
    return outcome.status
