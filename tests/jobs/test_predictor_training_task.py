"""The length predictor's training as a Celery beat task (cluster mode): scheduled every
settings.jobs.predictor_training_interval_s; the task body runs in-process here (no worker needed)."""

from __future__ import annotations

from pathlib import Path

from jobs.celery_app import make_celery
from jobs.task_names import TRAIN_LENGTH_PREDICTOR_TASK
from migrations.runner import upgrade
from registry.db import make_engine, make_session_factory
from registry.predictor_artifacts import read_pointer
from registry.storage import LocalBlobStore
from settings import Settings
from tests.registry.predictor_rows import MEDIANS, distinct_specs, insert_rows, make_versions


def _settings(tmp_path: Path, redis_url: str, **overrides: object) -> Settings:
    return Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
                    blob_store=str(tmp_path / "blobs"), redis_url=redis_url, is_inline_jobs=False,
                    **overrides)  # fmt: skip


def _schedule(settings: Settings) -> dict[str, float]:
    return {entry["task"]: entry["schedule"] for entry in make_celery(settings).conf.beat_schedule.values()}


def test_beat_trains_the_length_predictor_every_configured_interval(tmp_path: Path, redis_url: str) -> None:
    assert (
        _schedule(_settings(tmp_path, redis_url, predictor_training_interval_s=42.0))[
            TRAIN_LENGTH_PREDICTOR_TASK
        ]
        == 42.0
    )
    assert TRAIN_LENGTH_PREDICTOR_TASK not in _schedule(
        _settings(tmp_path, redis_url, predictor_training_interval_s=0)
    )  # 0 = disabled, as for the inline timer


def test_the_task_trains_on_usage_and_publishes_the_model(tmp_path: Path, redis_url: str) -> None:
    settings = _settings(tmp_path, redis_url, predictor_min_training_samples=100)
    upgrade(settings.resolved_database_url())
    engine = make_engine(settings.resolved_database_url())
    try:
        with make_session_factory(engine)() as session:
            tenant_id, versions = make_versions(session, sorted(MEDIANS))
            insert_rows(session, tenant_id, distinct_specs(versions, 120))  # in 2031: inside the window
            session.commit()
        task = make_celery(settings).tasks[TRAIN_LENGTH_PREDICTOR_TASK]
        version = task()
    finally:
        engine.dispose()
    assert version is not None
    assert read_pointer(LocalBlobStore(tmp_path / "blobs")).version == version
