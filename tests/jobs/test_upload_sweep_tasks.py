"""The upload sweeps as Celery beat tasks (cluster mode): scheduled every settings.jobs.upload_sweep_interval_s,
ages from settings. The task bodies run in-process here (no worker needed to check what they do)."""

from __future__ import annotations

import io
import os
from datetime import timedelta
from pathlib import Path

from sqlalchemy import update

from jobs.celery_app import make_celery
from jobs.task_names import FAIL_STALE_VERSIONS_TASK, SWEEP_ORPHANED_BLOBS_TASK
from migrations.runner import upgrade
from registry import repository
from registry.db import make_engine, make_session_factory
from registry.models import AdapterVersion, utcnow
from registry.storage import LocalBlobStore
from settings import Settings


def _settings(tmp_path: Path, redis_url: str, **overrides: object) -> Settings:
    return Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
                    blob_store=str(tmp_path / "blobs"), redis_url=redis_url, is_inline_jobs=False,
                    **overrides)  # fmt: skip


def test_beat_runs_both_upload_sweeps_every_configured_interval(tmp_path: Path, redis_url: str) -> None:
    app = make_celery(_settings(tmp_path, redis_url, upload_sweep_interval_s=42.0))
    schedule = {entry["task"]: entry["schedule"] for entry in app.conf.beat_schedule.values()}
    assert schedule[FAIL_STALE_VERSIONS_TASK] == schedule[SWEEP_ORPHANED_BLOBS_TASK] == 42.0


def test_sweep_tasks_use_the_ages_from_settings(tmp_path: Path, redis_url: str) -> None:
    settings = _settings(tmp_path, redis_url, stale_version_age_s=600, orphan_blob_min_age_s=600)
    upgrade(settings.resolved_database_url())
    engine = make_engine(settings.resolved_database_url())
    store = LocalBlobStore(tmp_path / "blobs")
    try:
        with make_session_factory(engine)() as session:
            tenant = repository.create_tenant(session, "t")
            adapter = repository.get_or_create_adapter(session, tenant.id, "lora", base_model_name="b")
            stale = repository.add_adapter_version(session, tenant.id, adapter, status="validating")
            fresh = repository.add_adapter_version(session, tenant.id, adapter, status="validating")
            session.execute(update(AdapterVersion).where(AdapterVersion.id == stale.id)
                            .values(created_at=utcnow() - timedelta(seconds=700)))  # fmt: skip
            session.commit()
            stale_id, fresh_id = stale.id, fresh.id
        for key, age_s in (
            ("uploads/old/adapter_config.json", 700),
            ("uploads/new/adapter_config.json", 500),
        ):
            store.put_stream(key, io.BytesIO(b"{}"))
            moment = (utcnow() - timedelta(seconds=age_s)).timestamp()
            os.utime(store.root / key, (moment, moment))
        app = make_celery(settings)
        assert app.tasks[FAIL_STALE_VERSIONS_TASK]() == [stale_id]
        assert app.tasks[SWEEP_ORPHANED_BLOBS_TASK]() == ["uploads/old/adapter_config.json"]
        assert store.list_keys() == ["uploads/new/adapter_config.json"]
        with make_session_factory(engine)() as session:
            assert repository.get_version(session, fresh_id).status == "validating"
    finally:
        engine.dispose()
