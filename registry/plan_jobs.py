"""Capacity-plan jobs (table plan_jobs): create, read, move through queued -> running -> a terminal status.

Invariants: a terminal status (succeeded, failed, cancelled) is never overwritten, so when a cancellation and
the job's own end race, the first written wins. A job still queued or running past its `deadline_at` has lost
its runner (an API process that died, a Celery worker killed past the time limit): it reads, and is counted,
as failed (`expire_overdue`). Jobs are admin-wide (not tenant data).

Every change runs in a write transaction of its own (`_write`: SQLite's BEGIN IMMEDIATE, retried on a transient
lock error), never as an upgrade of a read: the API polls and expires jobs while a Celery worker claims and
finishes them against the same database, and an upgraded read is refused at once with "database is locked".
A worker takes a job with `claim_plan_job`: the check (still queued, a free slot) and the move to running are
one transaction, so two workers never both start one job or run past planner_max_running together.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from registry.db import run_in_write_transaction
from registry.models import PLAN_JOB_ACTIVE_STATUSES, PlanJob, utcnow

T = TypeVar("T")
ClaimResult = Literal["claimed", "busy", "gone"]

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

    def insert(s: Session) -> PlanJob:
        s.add(job)
        return job

    return _write(session, insert)


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


def mark_plan_job_running(session: Session, job_id: str, deadline_s: float) -> bool:
    """queued -> running with a new deadline; False when the job is no longer queued (cancelled meanwhile)."""
    return _write(session, lambda s: _move_in(s, job_id, ("queued",), _running_values(deadline_s)))


def claim_plan_job(session: Session, job_id: str, max_running: int, deadline_s: float) -> ClaimResult:
    """Move a queued job to running when fewer than `max_running` jobs run (overdue ones failed first), in one
    transaction: "claimed", "busy" (no free slot: try again later) or "gone" (unknown or no longer queued)."""

    def claim(s: Session) -> ClaimResult:
        _fail_where_in(s, LOST_RUNNER_ERROR, PlanJob.deadline_at < utcnow())
        if s.scalar(select(PlanJob.status).where(PlanJob.id == job_id)) != "queued":
            return "gone"
        running = s.scalar(select(func.count()).select_from(PlanJob).where(PlanJob.status == "running")) or 0
        if running >= max_running:
            return "busy"
        _move_in(s, job_id, ("queued",), _running_values(deadline_s))
        return "claimed"

    return _write(session, claim)


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
    return _write(session, lambda s: _fail_where_in(s, reason, *conditions))


def _move(session: Session, job_id: str, from_statuses: tuple[str, ...], values: dict[str, Any]) -> bool:
    return _write(session, lambda s: _move_in(s, job_id, from_statuses, values))


def _fail_where_in(session: Session, reason: str, *conditions: Any) -> int:
    statement = (
        update(PlanJob)
        .where(PlanJob.status.in_(PLAN_JOB_ACTIVE_STATUSES), *conditions)
        .values(status="failed", error=reason, finished_at=utcnow())
    )
    return int(session.execute(statement).rowcount or 0)  # type: ignore[attr-defined]


def _move_in(session: Session, job_id: str, from_statuses: tuple[str, ...], values: dict[str, Any]) -> bool:
    statement = (
        update(PlanJob).where(PlanJob.id == job_id, PlanJob.status.in_(from_statuses)).values(**values)
    )
    return bool(session.execute(statement).rowcount)  # type: ignore[attr-defined]


def _running_values(deadline_s: float) -> dict[str, Any]:
    now = utcnow()
    return {"status": "running", "started_at": now, "deadline_at": now + timedelta(seconds=deadline_s)}


def _write(session: Session, work: Callable[[Session], T]) -> T:
    """Run `work` in a write transaction of its own and commit it (module doc)."""
    session.commit()  # end what the caller read so far: the change starts a transaction of its own
    return run_in_write_transaction(session, work)


def delete_plan_job(session: Session, job_id: str) -> None:
    """Remove a job row (one that could not be queued after all)."""

    def delete(s: Session) -> None:
        job = s.get(PlanJob, job_id)
        if job is not None:
            s.delete(job)

    _write(session, delete)
