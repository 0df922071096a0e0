"""The usage sweep (dead workers, expired leases, the daily rollup): the job wiring (directory + DB), its inline timer and its
Celery task."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.main import _sweep_usage
from cluster.membership import InMemoryWorkerDirectory, RedisWorkerDirectory, WorkerRecord
from jobs.celery_app import make_celery
from jobs.task_names import CLOSE_ORPHANED_USAGE_TASK
from jobs.usage_sweep import PeriodicJob, sweep_grace_s, sweep_orphaned_usage, sweep_usage
from registry import repository
from registry.db import make_engine, make_session_factory
from registry.models import RolledUsageDay, UsageDay, UsageRecord, new_id, utcnow
from registry.usage import record_usage
from registry.usage_batches import open_usage
from settings import Settings


def _open_rows(
    factory: sessionmaker[Session], worker_ids: list[str | None], lease_age_s: float = 0.0
) -> tuple[str, list[str]]:
    """Rows that started an hour ago, whose owner last renewed their lease `lease_age_s` ago (0: it is live)."""
    with factory() as session:
        tenant_id = repository.create_tenant(session, f"sweep-{new_id()[:8]}").id
        session.commit()
        long_ago = utcnow() - timedelta(hours=1)
        renewed_at = utcnow() - timedelta(seconds=lease_age_s)
        request_ids = [f"req-{new_id()}" for _ in worker_ids]
        open_usage(
            session,
            [
                {
                    "request_id": rid,
                    "tenant_id": tenant_id,
                    "model_name": "m",
                    "status": "in_progress",
                    "worker_id": wid,
                    "api_instance_id": "api-1",
                    "started_at": long_ago,
                    "lease_renewed_at": renewed_at,
                }
                for rid, wid in zip(request_ids, worker_ids)
            ],
        )
    return tenant_id, request_ids


def _statuses(factory: sessionmaker[Session], tenant_id: str) -> dict[str, str]:
    with factory() as session:
        rows = session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id))
        return {r.request_id: r.status for r in rows}


def test_sweep_closes_the_rows_of_workers_missing_from_the_directory(
    db_session_factory: sessionmaker[Session],
) -> None:
    tenant_id, (live_row, dead_row) = _open_rows(db_session_factory, ["w-live", "w-dead"])
    directory = InMemoryWorkerDirectory()
    directory.heartbeat(WorkerRecord("w-live", "http://w", "base"), ttl_s=60)
    assert sweep_orphaned_usage(db_session_factory, directory, grace_s=5) == [dead_row]
    assert _statuses(db_session_factory, tenant_id) == {live_row: "in_progress", dead_row: "interrupted"}


def test_sweep_closes_the_rows_of_expired_leases_with_or_without_a_directory(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, usage_lease_timeout_s=30.0)
    expired_tenant, (expired, expired_unrouted) = _open_rows(
        db_session_factory, ["w-live", None], lease_age_s=31
    )
    live_tenant, (live,) = _open_rows(db_session_factory, ["w-live"], lease_age_s=5)
    assert (
        sweep_usage(db_session_factory, None, settings) >= 2
    )  # the shared DB may hold other tests' open rows
    assert _statuses(db_session_factory, expired_tenant) == {
        expired: "interrupted",
        expired_unrouted: "interrupted",
    }
    assert _statuses(db_session_factory, live_tenant) == {live: "in_progress"}

    directory = InMemoryWorkerDirectory()
    directory.heartbeat(WorkerRecord("w-live", "http://w", "base"), ttl_s=60)
    later_tenant, (later,) = _open_rows(db_session_factory, ["w-live"], lease_age_s=60)
    sweep_usage(db_session_factory, directory, settings)
    assert _statuses(db_session_factory, later_tenant) == {
        later: "interrupted"
    }  # its worker lives, its API not
    assert _statuses(db_session_factory, live_tenant) == {live: "in_progress"}


def test_the_inline_timer_sweeps_leases_before_any_worker_directory_exists(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    tenant_id, (expired,) = _open_rows(db_session_factory, [None], lease_age_s=120)
    services = SimpleNamespace(
        session_factory=db_session_factory, worker_directory=None, settings=Settings(data_dir=tmp_path)
    )
    _sweep_usage(services)  # type: ignore[arg-type]
    assert _statuses(db_session_factory, tenant_id) == {expired: "interrupted"}


def test_lease_timeout_must_leave_room_for_two_renewals(tmp_path: Path) -> None:
    import pydantic
    import pytest

    assert Settings(data_dir=tmp_path).metering.lease_timeout_s == 30.0
    with pytest.raises(pydantic.ValidationError, match="LORAHOST_USAGE_LEASE_TIMEOUT_S"):
        Settings(data_dir=tmp_path, usage_checkpoint_interval_s=10.0, usage_lease_timeout_s=20.0)


def test_leases_are_renewed_four_times_a_lease_and_never_more_often_than_checkpoints(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).metering.renewal_interval_s == 7.5  # the default 30 s lease
    assert Settings(data_dir=tmp_path, usage_lease_timeout_s=2.5).metering.renewal_interval_s == 1.0
    settings = Settings(data_dir=tmp_path, usage_checkpoint_interval_s=2.0, usage_lease_timeout_s=60.0)
    assert settings.metering.renewal_interval_s == 15.0


def test_grace_covers_a_missed_heartbeat_and_two_checkpoints(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, heartbeat_interval_s=2.0, usage_checkpoint_interval_s=1.0)
    assert sweep_grace_s(settings) == 2 * 1.0 + 3 * 2.0


def test_periodic_job_runs_every_interval_until_stopped() -> None:
    ran = threading.Semaphore(0)
    job = PeriodicJob("test", 0.01, ran.release).start()
    assert all(ran.acquire(timeout=30) for _ in range(3))
    job.stop()
    assert not job._thread.is_alive()


def test_celery_beat_task_sweeps_with_the_redis_directory(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    import redis

    prefix = f"lorahost-test:{uuid.uuid4().hex[:8]}:"
    settings = Settings(
        data_dir=tmp_path, database_url=sqlite_url, redis_url=redis_url, worker_key_prefix=prefix
    )
    app = make_celery(settings)
    assert any(e["task"] == CLOSE_ORPHANED_USAGE_TASK for e in app.conf.beat_schedule.values())
    engine = make_engine(sqlite_url)
    factory = make_session_factory(engine)
    client = redis.Redis.from_url(redis_url)
    try:
        RedisWorkerDirectory(client, prefix).heartbeat(WorkerRecord("w-live", "http://w", "base"), ttl_s=60)
        tenant_id, (live_row, dead_row) = _open_rows(factory, ["w-live", "w-dead"])
        expired_tenant, (expired_row,) = _open_rows(factory, ["w-live"], lease_age_s=3600)
        assert app.tasks[CLOSE_ORPHANED_USAGE_TASK]() >= 2  # the shared file DB may hold older open rows
        assert _statuses(factory, tenant_id) == {live_row: "in_progress", dead_row: "interrupted"}
        assert _statuses(factory, expired_tenant) == {expired_row: "interrupted"}
    finally:
        RedisWorkerDirectory(client, prefix).remove("w-live")
        client.close()
        engine.dispose()


def test_the_sweep_rolls_up_settled_days_and_leaves_today_raw(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with db_session_factory() as session:
        tenant_id = repository.create_tenant(session, f"rollup-{new_id()[:8]}").id
        three_days_ago = utcnow() - timedelta(days=3)
        for request_id, started_at in (
            ("old-1", three_days_ago),
            ("old-2", three_days_ago),
            ("now-1", utcnow()),
        ):
            record_usage(session, request_id=f"{request_id}-{new_id()}", tenant_id=tenant_id, model_name="a",
                         status="ok", prompt_tokens=5, completion_tokens=2, started_at=started_at)  # fmt: skip
    sweep_usage(db_session_factory, None, Settings(data_dir=tmp_path, usage_rollup_settle_s=3600.0))
    with db_session_factory() as session:
        rolled = set(session.scalars(select(RolledUsageDay.day)))
        assert three_days_ago.date() in rolled and utcnow().date() not in rolled
        sums = session.scalars(select(UsageDay).where(UsageDay.tenant_id == tenant_id)).all()
        assert [(s.day, s.model_name, s.num_requests, s.prompt_tokens) for s in sums] == [
            (three_days_ago.date(), "a", 2, 10)
        ]
