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
    transport_options: dict[str, object] = redelivery_options(settings.jobs.celery_visibility_timeout_s)
    if settings.jobs.celery_key_prefix:
        transport_options["global_keyprefix"] = settings.jobs.celery_key_prefix
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


def redelivery_options(visibility_timeout_s: float) -> dict[str, object]:
    """Redis transport options that deliver a task again once it has been unacknowledged (its runner was killed)
    for visibility_timeout_s: every live runner looks for such tasks every interval (a tenth of the timeout, from
    1 to 10 s), not kombu's default of every tenth 10 s tick (100 s)."""
    return {
        "visibility_timeout": visibility_timeout_s,
        "unacked_restore_interval": min(10, max(1, round(visibility_timeout_s / 10))),
        "unacked_restore_throttle": 1,
    }
