"""Dispatcher choice from settings (inline vs Celery)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.celery_app import make_celery
from jobs.celery_client import make_celery_client
from jobs.dispatch import CeleryJobs, InlineJobs, make_job_dispatcher
from jobs.task_names import VALIDATE_ADAPTER_TASK
from registry.adapter_pipeline import make_job_context
from settings import Settings


def test_inline_settings_give_inline_jobs(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, is_inline_jobs=True)
    assert isinstance(make_job_dispatcher(settings, make_job_context(settings)), InlineJobs)


def test_celery_settings_give_celery_jobs_without_connecting(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, is_inline_jobs=False, redis_url="redis://127.0.0.1:1/0")
    jobs = make_job_dispatcher(settings, make_job_context(settings))
    assert isinstance(jobs, CeleryJobs) and not jobs.is_inline


def test_the_celery_dispatcher_sends_by_name_through_a_client_without_task_bodies(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, is_inline_jobs=False, redis_url="redis://127.0.0.1:1/0", celery_key_prefix="p:"
    )
    jobs = make_job_dispatcher(settings, make_job_context(settings))
    assert isinstance(jobs, CeleryJobs)
    assert not [name for name in jobs.celery_app.tasks if name.startswith("lorahost.")]
    assert jobs.celery_app.conf.broker_transport_options == {
        "global_keyprefix": "p:",
        "visibility_timeout": 600.0,
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 1,
    }
    assert jobs.celery_app.conf.task_default_queue == settings.jobs.celery_queue


def test_celery_app_registers_the_validation_task_and_key_prefix(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        redis_url="redis://127.0.0.1:1/0",
        celery_key_prefix="p:",
        celery_queue="q",
        celery_visibility_timeout_s=30,
    )
    app = make_celery(settings)
    assert VALIDATE_ADAPTER_TASK in app.tasks
    assert app.conf.broker_transport_options == {
        "global_keyprefix": "p:",
        "visibility_timeout": 30.0,
        "unacked_restore_interval": 3,
        "unacked_restore_throttle": 1,
    }
    assert app.conf.task_default_queue == "q"


def test_celery_without_a_broker_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="LORAHOST_REDIS_URL"):
        make_celery(Settings(data_dir=tmp_path, redis_url=None))
    with pytest.raises(ValueError, match="LORAHOST_REDIS_URL"):
        make_celery_client(Settings(data_dir=tmp_path, redis_url=None))
