"""Job dispatchers: how the API hands work to the job runner.

`InlineJobs` (embedded mode) runs the plain function in the calling thread, so when `dispatch` returns the
job is done. `CeleryJobs` sends the task to Redis for a Celery worker. Both expose the same methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from registry.adapter_pipeline import AdapterJobContext
from registry.validation_job import run_validation_job

if TYPE_CHECKING:
    from celery import Celery

    from settings import Settings

VALIDATE_ADAPTER_TASK = "lorahost.validate_adapter_version"
FAIL_STALE_VERSIONS_TASK = "lorahost.fail_stale_versions"
SWEEP_ORPHANED_BLOBS_TASK = "lorahost.sweep_orphaned_blobs"
CLOSE_ORPHANED_USAGE_TASK = "lorahost.close_orphaned_usage"
TRAIN_LENGTH_PREDICTOR_TASK = "lorahost.train_length_predictor"
COMPUTE_PLACEMENT_TASK = "lorahost.compute_placement"


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
    """InlineJobs when `settings.jobs.is_inline_jobs`, else CeleryJobs over `make_celery(settings)`."""
    if settings.jobs.is_inline_jobs:
        return InlineJobs(ctx)
    from jobs.celery_app import make_celery

    return CeleryJobs(make_celery(settings), settings.jobs.celery_queue)
