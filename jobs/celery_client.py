"""A bare Celery app configured from settings: broker, queue, key prefix and delivery options, no tasks.

The API sends tasks through it by name (jobs/dispatch.py, names in jobs/task_names.py); the job runner's app
(jobs/celery_app.py) starts from the same configuration and adds the beat schedule and the task bodies.
Nothing connects when it is built: the broker is contacted when a task is sent or a worker starts.
"""

from __future__ import annotations

from celery import Celery

from settings import Settings


def make_celery_client(settings: Settings) -> Celery:
    """A Celery app on the Redis broker from settings, with no task registered."""
    broker = settings.resolved_broker_url()
    if not broker:
        raise ValueError("Celery jobs need a broker: set LORAHOST_REDIS_URL or LORAHOST_CELERY_BROKER_URL")
    app = Celery("lorahost", broker=broker, set_as_current=False)
    transport_options = (
        {"global_keyprefix": settings.jobs.celery_key_prefix} if settings.jobs.celery_key_prefix else {}
    )
    app.conf.update(
        task_default_queue=settings.jobs.celery_queue,
        broker_transport_options=transport_options,
        task_acks_late=True,  # a worker killed mid-job leaves the task for another worker
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
    )
    return app
