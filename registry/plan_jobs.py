"""Capacity-plan jobs (table plan_jobs): create, read, move through queued -> running -> a terminal status.

Invariants: a terminal status (succeeded, failed, cancelled) is never overwritten, so when a cancellation and
the job's own end race, the first written wins. A job still queued or running past its `deadline_at` has lost
its runner (an API process that died, a Celery worker killed past the time limit): it reads, and is counted,
as failed (`expire_overdue`). Jobs are admin-wide (not tenant data).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from registry.models import PLAN_JOB_ACTIVE_STATUSES, PlanJob, utcnow

LOST_RUNNER_ERROR = "the plan's job runner stopped before the plan finished (server restarted or worker lost): submit it again"


def create_plan_job(
    session: Session, inputs: dict[str, Any], runner: str, owner: str | None, deadline_s: float
) -> PlanJob:
    """A queued job of these inputs, committed; it is taken for lost when not finished within deadline_s."""
    job = PlanJob(
        inputs=inputs,
        runner=runner,
        owner=owner,
        status="queued",
        deadline_at=utcnow() + timedelta(seconds=deadline_s),
    )
    session.add(job)
    session.commit()
    return job


def get_plan_job(session: Session, job_id: str) -> PlanJob | None:
    """The job (an overdue unfinished one is failed first), None for an unknown id."""
    expire_overdue(session)
    return session.get(PlanJob, job_id, populate_existing=True)


def plan_job_status(session: Session, job_id: str) -> str | None:
    """The job's status as stored (one indexed read; no expiry), None for an unknown id."""
    return session.scalar(select(PlanJob.status).where(PlanJob.id == job_id))


def count_active_plan_jobs(session: Session) -> int:
    """Jobs queued or running (overdue ones are failed first)."""
    expire_overdue(session)
    query = select(func.count()).select_from(PlanJob).where(PlanJob.status.in_(PLAN_JOB_ACTIVE_STATUSES))
    return int(session.scalar(query) or 0)


def count_running_plan_jobs(session: Session) -> int:
    """Jobs running now (overdue ones are failed first)."""
    expire_overdue(session)
    return int(
        session.scalar(select(func.count()).select_from(PlanJob).where(PlanJob.status == "running")) or 0
    )


def mark_plan_job_running(session: Session, job_id: str, deadline_s: float) -> bool:
    """queued -> running with a new deadline; False when the job is no longer queued (cancelled meanwhile)."""
    now = utcnow()
    values = {"status": "running", "started_at": now, "deadline_at": now + timedelta(seconds=deadline_s)}
    return _move(session, job_id, ("queued",), values)


def finish_plan_job(
    session: Session,
    job_id: str,
    status: str,
    *,
    result: dict[str, Any] | None = None,
    error: str | None = None,
) -> bool:
    """Write a terminal status (with the plan or the reason) unless one is written already; True if written."""
    values = {"status": status, "result": result, "error": error, "finished_at": utcnow()}
    return _move(session, job_id, PLAN_JOB_ACTIVE_STATUSES, values)


def fail_plan_jobs_of_owner(session: Session, owner: str, reason: str = LOST_RUNNER_ERROR) -> int:
    """Fail the unfinished embedded jobs of API process `owner` (what it left when it died); how many."""
    return _fail_where(session, reason, PlanJob.owner == owner, PlanJob.runner == "embedded")


def expire_overdue(session: Session, now: datetime | None = None) -> int:
    """Fail the unfinished jobs past their deadline (their runner is gone); how many."""
    return _fail_where(session, LOST_RUNNER_ERROR, PlanJob.deadline_at < (now or utcnow()))


def _fail_where(session: Session, reason: str, *conditions: Any) -> int:
    statement = (
        update(PlanJob)
        .where(PlanJob.status.in_(PLAN_JOB_ACTIVE_STATUSES), *conditions)
        .values(status="failed", error=reason, finished_at=utcnow())
    )
    count = session.execute(statement).rowcount  # type: ignore[attr-defined]
    session.commit()
    return int(count or 0)


def _move(session: Session, job_id: str, from_statuses: tuple[str, ...], values: dict[str, Any]) -> bool:
    statement = (
        update(PlanJob).where(PlanJob.id == job_id, PlanJob.status.in_(from_statuses)).values(**values)
    )
    count = session.execute(statement).rowcount  # type: ignore[attr-defined]
    session.commit()
    return bool(count)


def delete_plan_job(session: Session, job_id: str) -> None:
    """Remove a job row (one that could not be queued after all)."""
    job = session.get(PlanJob, job_id)
    if job is not None:
        session.delete(job)
        session.commit()
