"""Plan runners: how the API hands a capacity-plan job (registry/plan_jobs.py) to something that runs it out of
the request path.

`EmbeddedPlanRunner` (inline jobs): a bounded queue and settings.placement.planner_max_running threads, each
running one plan at a time in a low-priority child process (jobs/plan_process.py) and writing the row.
`CeleryPlanRunner`: sends the task by name (the job id is the task id) to a Celery worker, which writes the
row itself (jobs/plan_task.py); cancelling revokes it with terminate. Both expose the same methods; the API
writes `cancelled` on the row before it asks either to stop.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from jobs.plan_process import PlanOutcome, run_plan_process
from jobs.task_names import RUN_CAPACITY_PLAN_TASK
from registry.plan_jobs import finish_plan_job, mark_plan_job_running

if TYPE_CHECKING:
    from celery import Celery
    from sqlalchemy.orm import Session, sessionmaker

    from settings import Settings

CANCEL_WAIT_S = 10.0  # how long cancel() waits for the killed child to be reaped
CLOSE_WAIT_S = 10.0  # how long close() waits for the runner threads
DEADLINE_GRACE_S = (
    60.0  # beyond the time limit before a job's runner is taken for dead (registry/plan_jobs.py)
)
SERVER_STOPPED_ERROR = "the server stopped before this plan finished: submit it again"


class PlanRunner(Protocol):
    """What the API may ask of whoever runs capacity plans."""

    name: str  # the runner column of the job rows it runs: "embedded" or "celery"

    def submit(self, job_id: str, inputs: dict[str, Any]) -> bool:
        """Queue the job; False when the queue is full (nothing was queued)."""

    def cancel(self, job_id: str) -> None:
        """Stop the job if it waits or runs (its row already says cancelled)."""

    def close(self) -> None:
        """Stop every running plan now (the API process is stopping)."""


def queued_deadline_s(settings: Settings) -> float:
    """Seconds a queued job may take to finish before its runner is taken for dead: its own time limit after
    every job the bound lets in before it."""
    placement = settings.placement
    rounds = math.ceil(
        (placement.planner_max_queued + placement.planner_max_running) / placement.planner_max_running
    )
    return placement.planner_time_limit_s * (rounds + 1) + DEADLINE_GRACE_S


def running_deadline_s(settings: Settings) -> float:
    """Seconds a running job may take before its runner is taken for dead."""
    return settings.placement.planner_time_limit_s + DEADLINE_GRACE_S


def planner_cache_dir(settings: Settings) -> Path:
    """Where the surrogate's twin training runs are cached."""
    return settings.placement.planner_cache_dir or settings.data_dir / "planner"


class EmbeddedPlanRunner:
    """A bounded queue and a fixed number of runner threads, each waiting on one plan's child process."""

    name = "embedded"

    def __init__(self, session_factory: sessionmaker[Session], settings: Settings) -> None:
        self.session_factory = session_factory
        self.settings = settings
        self.max_running = settings.placement.planner_max_running
        self.max_jobs = self.max_running + settings.placement.planner_max_queued
        self._condition = threading.Condition()
        self._queue: deque[tuple[str, dict[str, Any]]] = deque()
        self._running: dict[str, int | None] = {}  # job id -> its child's pid (None until started)
        self._stopping: set[str] = set()
        self._done: dict[str, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._is_closing = False

    def submit(self, job_id: str, inputs: dict[str, Any]) -> bool:
        with self._condition:
            if self._is_closing or len(self._queue) + len(self._running) >= self.max_jobs:
                return False
            self._start_threads()
            self._queue.append((job_id, inputs))
            self._done[job_id] = threading.Event()
            self._condition.notify()
            return True

    def cancel(self, job_id: str) -> None:
        with self._condition:
            queued = [item for item in self._queue if item[0] == job_id]
            for item in queued:
                self._queue.remove(item)
                self._done.pop(job_id).set()
            if job_id in self._running:
                self._stopping.add(job_id)
            done = self._done.get(job_id)
        if done is not None:
            done.wait(CANCEL_WAIT_S)

    def wait(self, job_id: str, timeout_s: float) -> bool:
        """Wait until the job has left this runner (finished, failed, cancelled); False on timeout."""
        with self._condition:
            done = self._done.get(job_id)
        return done is None or done.wait(timeout_s)

    def child_pid(self, job_id: str) -> int | None:
        """The pid of the job's child process while it runs (None otherwise)."""
        with self._condition:
            return self._running.get(job_id)

    def close(self) -> None:
        with self._condition:
            self._is_closing = True
            dropped = [job_id for job_id, _ in self._queue]
            self._queue.clear()
            self._stopping.update(self._running)
            threads, self._threads = self._threads, []
            self._condition.notify_all()
        for job_id in dropped:
            self._finish(job_id, PlanOutcome("failed", error=SERVER_STOPPED_ERROR))
        for thread in threads:
            thread.join(CLOSE_WAIT_S)
        with self._condition:
            self._is_closing = False  # a later submit (the app started again) starts new threads

    def _start_threads(self) -> None:
        while len(self._threads) < self.max_running:
            thread = threading.Thread(
                target=self._work, name=f"plan-runner-{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        while True:
            with self._condition:
                while not self._queue and not self._is_closing:
                    self._condition.wait()
                if self._is_closing:
                    return
                job_id, inputs = self._queue.popleft()
                self._running[job_id] = None
            try:
                self._run(job_id, inputs)
            finally:
                with self._condition:
                    self._running.pop(job_id, None)
                    self._stopping.discard(job_id)
                    done = self._done.pop(job_id, None)
                if done is not None:
                    done.set()

    def _run(self, job_id: str, inputs: dict[str, Any]) -> None:
        with self.session_factory() as session:
            if not mark_plan_job_running(session, job_id, running_deadline_s(self.settings)):
                return  # cancelled while it waited
        try:
            outcome = run_plan_process(
                inputs,
                self.settings.engine,
                planner_cache_dir(self.settings),
                self.settings.placement.planner_time_limit_s,
                should_stop=lambda: job_id in self._stopping,
                on_start=lambda pid: self._set_pid(job_id, pid),
            )
        except Exception as exc:  # noqa: BLE001 - e.g. no process could be started: the row says why
            outcome = PlanOutcome("failed", error=f"the plan could not run: {type(exc).__name__}: {exc}")
        if outcome.status == "cancelled" and self._is_closing:
            outcome = PlanOutcome("failed", error=SERVER_STOPPED_ERROR)
        self._finish(job_id, outcome)

    def _set_pid(self, job_id: str, pid: int) -> None:
        with self._condition:
            self._running[job_id] = pid

    def _finish(self, job_id: str, outcome: PlanOutcome) -> None:
        with self.session_factory() as session:
            finish_plan_job(session, job_id, outcome.status, result=outcome.result, error=outcome.error)


class CeleryPlanRunner:
    """Sends plan jobs to a Celery worker by task name; the task id is the job id."""

    name = "celery"

    def __init__(self, celery_app: Celery, queue: str) -> None:
        self.celery_app = celery_app
        self.queue = queue

    def submit(self, job_id: str, inputs: dict[str, Any]) -> bool:
        self.celery_app.send_task(RUN_CAPACITY_PLAN_TASK, args=[job_id], queue=self.queue, task_id=job_id)
        return True

    def cancel(self, job_id: str) -> None:
        # A prefork worker kills the task's process; the task itself also sees `cancelled` on the row and kills
        # its plan's child (jobs/plan_task.py), which is what stops it under the solo pool.
        self.celery_app.control.revoke(job_id, terminate=True)

    def close(self) -> None:
        """Nothing to stop here: the Celery workers own the running plans."""


def make_plan_runner(settings: Settings, session_factory: sessionmaker[Session]) -> PlanRunner:
    """EmbeddedPlanRunner with inline jobs, else CeleryPlanRunner over a bare client (no task bodies)."""
    if settings.jobs.is_inline_jobs:
        return EmbeddedPlanRunner(session_factory, settings)
    from jobs.celery_client import make_celery_client

    return CeleryPlanRunner(make_celery_client(settings), settings.jobs.celery_queue)
