"""A Celery worker claims a plan job while another connection writes to the same SQLite file (the API polling
and expiring jobs): the claim waits for the write lock instead of failing with "database is locked" and
leaving the job queued forever (the CI failure of test_plan_task: a read upgraded to a write)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from jobs import plan_task
from jobs.plan_process import PlanOutcome
from migrations.runner import upgrade
from registry.db import make_engine, make_session_factory
from registry.plan_jobs import claim_plan_job, create_plan_job, get_plan_job
from settings import Settings

WAIT_S = 30.0


def _factory(tmp_path: Path) -> tuple[Any, Any, Path]:
    path = tmp_path / "jobs.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    engine = make_engine(url)
    return engine, make_session_factory(engine), path


def _signal_on_first_write(engine: Any) -> threading.Event:
    """Set once the engine is about to take the write lock (BEGIN IMMEDIATE) or write (an UPDATE)."""
    reached = threading.Event()

    @event.listens_for(engine, "before_cursor_execute")
    def _before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith(("BEGIN IMMEDIATE", "UPDATE")):
            reached.set()

    return reached


def test_run_plan_job_claims_its_job_while_another_connection_holds_the_write_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, factory, path = _factory(tmp_path)
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{path}")
    with factory() as session:
        job_id = create_plan_job(session, {"workload": {}}, "celery", None, 600.0).id
    monkeypatch.setattr(
        plan_task, "run_plan_process", lambda *_a, **_k: PlanOutcome("succeeded", result={"num_gpus": 1})
    )
    reached = _signal_on_first_write(engine)
    other = sqlite3.connect(path, isolation_level=None)  # the API's connection, mid-write
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE plan_jobs SET error = NULL WHERE id = 'no such job'")
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["status"] = plan_task.run_plan_job(factory, settings, job_id)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert reached.wait(WAIT_S)  # the worker read the job (old code) or waits for the lock (new code)
    other.execute("COMMIT")
    other.close()
    worker.join(WAIT_S)
    assert outcome == {"status": "succeeded"}
    with factory() as session:
        job = get_plan_job(session, job_id)
        assert job is not None and job.status == "succeeded" and job.result == {"num_gpus": 1}


def test_claim_respects_the_running_limit_and_a_job_is_claimed_once(tmp_path: Path) -> None:
    _engine, factory, _path = _factory(tmp_path)
    with factory() as session:
        first = create_plan_job(session, {}, "celery", None, 600.0).id
        second = create_plan_job(session, {}, "celery", None, 600.0).id
        assert claim_plan_job(session, first, 1, 600.0) == "claimed"
        assert claim_plan_job(session, first, 1, 600.0) == "gone"  # running now: nobody claims it again
        assert claim_plan_job(session, second, 1, 600.0) == "busy"
        assert claim_plan_job(session, second, 2, 600.0) == "claimed"
        assert claim_plan_job(session, "no-such-job", 2, 600.0) == "gone"


def test_an_overdue_running_job_is_failed_and_frees_its_slot(tmp_path: Path) -> None:
    _engine, factory, _path = _factory(tmp_path)
    with factory() as session:
        stuck = create_plan_job(session, {}, "celery", None, 600.0).id
        waiting = create_plan_job(session, {}, "celery", None, 600.0).id
        assert claim_plan_job(session, stuck, 1, -1.0) == "claimed"  # its deadline has already passed
        assert claim_plan_job(session, waiting, 1, 600.0) == "claimed"
        job = get_plan_job(session, stuck)
        assert job is not None and job.status == "failed"
