"""The Celery app factory and its thin task wrappers over plain functions in registry/.

Run a worker with `celery -A jobs.worker worker` (jobs/worker.py is the entry point that builds settings).
Nothing connects at import time: the broker is contacted when the worker starts or a task is sent, and the
DB engine and blob store of a worker are built on its first task.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from celery import Celery

from cluster.membership import RedisWorkerDirectory
from jobs.celery_client import make_celery_client
from jobs.placement import http_dropper, make_routing_table_store
from jobs.plan_task import BUSY, run_plan_job
from jobs.task_names import (
    CLOSE_ORPHANED_USAGE_TASK,
    COMPUTE_PLACEMENT_TASK,
    FAIL_STALE_VERSIONS_TASK,
    RUN_CAPACITY_PLAN_TASK,
    SWEEP_ORPHANED_BLOBS_TASK,
    TRAIN_LENGTH_PREDICTOR_TASK,
    VALIDATE_ADAPTER_TASK,
)
from jobs.usage_sweep import sweep_usage
from registry import adapter_pipeline as pipeline
from registry import validation_job
from registry.db import is_transient_error
from registry.job_scratch import remove_abandoned_job_dirs
from registry.placement_job import run_placement
from registry.predictor_training import run_predictor_training
from registry.upload_sweeper import sweep_orphaned_blobs
from settings import Settings

PLAN_RETRY_S = 2.0  # a plan job waiting for a free slot (planner_max_running) is retried this often


def make_celery(settings: Settings) -> Celery:
    """The job runner's Celery app: the client's configuration (jobs/celery_client.py), the beat schedule and
    the lorahost tasks registered."""
    app = make_celery_client(settings)
    app.conf.beat_schedule = beat_schedule(settings)
    _register_tasks(app, settings)
    return app


def beat_schedule(settings: Settings) -> dict[str, dict[str, object]]:
    """Celery beat's periodic tasks, every settings.jobs.*_interval_s; an interval of 0 leaves its task out
    (disabled), as it leaves out the API's inline timer with inline jobs."""
    jobs = settings.jobs
    periodic = (
        ("fail-stale-adapter-versions", FAIL_STALE_VERSIONS_TASK, jobs.upload_sweep_interval_s),
        ("sweep-orphaned-upload-blobs", SWEEP_ORPHANED_BLOBS_TASK, jobs.upload_sweep_interval_s),
        ("close-orphaned-usage", CLOSE_ORPHANED_USAGE_TASK, jobs.usage_sweep_interval_s),
        ("train-length-predictor", TRAIN_LENGTH_PREDICTOR_TASK, jobs.predictor_training_interval_s),
        ("compute-placement", COMPUTE_PLACEMENT_TASK, jobs.placement_interval_s),
    )
    return {
        name: {"task": task, "schedule": interval_s} for name, task, interval_s in periodic if interval_s > 0
    }


def _register_tasks(app: Celery, settings: Settings) -> None:
    @cache
    def context() -> pipeline.AdapterJobContext:
        remove_abandoned_job_dirs()  # once per worker process: what a killed predecessor on this host left
        return pipeline.make_job_context(settings)

    @app.task(name=VALIDATE_ADAPTER_TASK, shared=False)  # per-app: the task closes over these settings
    def validate_adapter_version(version_id: str) -> str:
        """Validate an uploaded adapter version; marks it ready or failed."""
        return validation_job.run_validation_job(context(), version_id)

    @app.task(name=FAIL_STALE_VERSIONS_TASK, shared=False)
    def fail_stale_versions(max_age_s: float | None = None) -> list[str]:
        """Fail versions whose validation job was lost (periodic; default age settings.storage.stale_version_age_s)."""
        return validation_job.fail_stale_versions(
            context(), max_age_s or settings.storage.stale_version_age_s
        )

    @app.task(name=SWEEP_ORPHANED_BLOBS_TASK, shared=False)
    def sweep_orphaned_upload_blobs(min_age_s: float | None = None) -> list[str]:
        """Delete upload blobs no live version needs (periodic; default age settings.storage.orphan_blob_min_age_s)."""
        ctx = context()
        return sweep_orphaned_blobs(
            ctx.session_factory, ctx.blob_store, min_age_s or settings.storage.orphan_blob_min_age_s
        )

    @app.task(name=TRAIN_LENGTH_PREDICTOR_TASK, shared=False)
    def train_length_predictor() -> str | None:
        """Train the output-length predictor on recent usage and publish it to the blob store (periodic);
        returns the new version, None when there were too few finished requests."""
        ctx = context()
        run = run_predictor_training(ctx.session_factory, ctx.blob_store, settings)
        return None if run is None else run.pointer.version

    @app.task(name=COMPUTE_PLACEMENT_TASK, shared=False)
    def compute_placement() -> int:
        """Compute and publish the routing table (LoRAServe placement; periodic); returns its version."""
        import redis

        if not settings.storage.redis_url:
            raise ValueError("placement in cluster mode needs Redis: set LORAHOST_REDIS_URL")
        client = redis.Redis.from_url(settings.storage.redis_url)
        directory = RedisWorkerDirectory(client, settings.worker.key_prefix)
        store = make_routing_table_store(settings, client)
        drop = http_dropper(settings.internal_token)
        return run_placement(context().session_factory, directory, store, settings, drop=drop).version

    @app.task(name=RUN_CAPACITY_PLAN_TASK, shared=False, bind=True, max_retries=None)
    def run_capacity_plan(task: Any, job_id: str) -> str:
        """Run a capacity-plan job (POST /v1/admin/plan) in a child process and write its row; retried while
        settings.placement.planner_max_running plans run already, or after a transient database error (the job
        row stays queued: it must not be left there by a failed task)."""
        try:
            status = run_plan_job(context().session_factory, settings, job_id)
        except Exception as exc:
            if not is_transient_error(exc):
                raise
            raise task.retry(exc=exc, countdown=PLAN_RETRY_S) from exc
        if status == BUSY:
            raise task.retry(countdown=PLAN_RETRY_S)
        return status

    @app.task(name=CLOSE_ORPHANED_USAGE_TASK, shared=False)
    def close_orphaned_usage() -> int:
        """Close the open usage rows of workers that left the Redis worker directory and of expired leases
        (periodic); returns how many."""
        import redis

        directory = None  # without a shared directory no worker can be known dead; leases still expire
        if settings.storage.redis_url:
            directory = RedisWorkerDirectory(
                redis.Redis.from_url(settings.storage.redis_url), settings.worker.key_prefix
            )
        return sweep_usage(context().session_factory, directory, settings)
