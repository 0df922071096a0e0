"""Job dispatchers: how the API hands work to the job runner.

`InlineJobs` (embedded mode) runs the plain function in the calling thread, so when `dispatch` returns the
job is done. `CeleryJobs` sends the task by name (jobs/task_names.py) to Redis for a Celery worker, through a
bare client app that holds no task bodies. Both expose the same methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from jobs.task_names import VALIDATE_ADAPTER_TASK
from registry.adapter_pipeline import AdapterJobContext
from registry.validation_job import run_validation_job

if TYPE_CHECKING:
    from celery import Celery

    from settings import Settings


class JobDispatcher(Protocol):
    """What the API may ask of the job runner."""

    is_inline: bool

    def validate_adapter_version(self, version_id: str) -> None:
        """Run (or enqueue) the validation job of an adapter version."""


class InlineJobs:
    """Runs jobs synchronously in-process (embedded mode and tests)."""

    is_inline = True

    def __init__(self, ctx: AdapterJobContext) -> None:
        self.ctx = ctx

    def validate_adapter_version(self, version_id: str) -> None:
        run_validation_job(self.ctx, version_id)


class CeleryJobs:
    """Enqueues jobs on a Celery broker by task name (the API never imports the task bodies)."""

    is_inline = False

    def __init__(self, celery_app: Celery, queue: str) -> None:
        self.celery_app = celery_app
        self.queue = queue

    def validate_adapter_version(self, version_id: str) -> None:
        self.celery_app.send_task(VALIDATE_ADAPTER_TASK, args=[version_id], queue=self.queue)


def make_job_dispatcher(settings: Settings, ctx: AdapterJobContext) -> JobDispatcher:
    """InlineJobs when `settings.jobs.is_inline_jobs`, else CeleryJobs over a bare client (no task bodies)."""
    if settings.jobs.is_inline_jobs:
        return InlineJobs(ctx)
    from jobs.celery_client import make_celery_client

    return CeleryJobs(make_celery_client(settings), settings.jobs.celery_queue)
