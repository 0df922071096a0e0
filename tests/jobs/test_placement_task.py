"""The placement job as a Celery beat task (cluster mode: Redis directory and store), and the worker drop call."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import redis

from cluster.membership import RedisWorkerDirectory, WorkerRecord
from cluster.routing_table import RedisRoutingTableStore
from jobs.celery_app import make_celery
from jobs.placement import http_dropper, make_routing_table_store
from jobs.task_names import COMPUTE_PLACEMENT_TASK
from migrations.runner import upgrade
from settings import Settings


def _settings(tmp_path: Path, redis_url: str, **overrides: object) -> Settings:
    return Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
                    blob_store=str(tmp_path / "blobs"), redis_url=redis_url, is_inline_jobs=False,
                    celery_key_prefix=f"test-{uuid.uuid4().hex[:8]}:", **overrides)  # fmt: skip


def test_beat_runs_placement_every_configured_interval(tmp_path: Path, redis_url: str) -> None:
    settings = _settings(tmp_path, redis_url, placement_interval_s=7.0)
    schedule = {e["task"]: e["schedule"] for e in make_celery(settings).conf.beat_schedule.values()}
    assert schedule[COMPUTE_PLACEMENT_TASK] == 7.0


def test_the_task_publishes_a_table_for_the_live_workers_in_redis(tmp_path: Path, redis_url: str) -> None:
    settings = _settings(tmp_path, redis_url)
    upgrade(settings.resolved_database_url())
    client = redis.Redis.from_url(redis_url)
    directory = RedisWorkerDirectory(client, settings.worker.key_prefix)
    directory.heartbeat(
        WorkerRecord(f"w-{uuid.uuid4().hex[:6]}", "http://127.0.0.1:9", settings.base_model_name), 30
    )
    store = make_routing_table_store(settings, client)
    assert isinstance(store, RedisRoutingTableStore)
    try:
        version = make_celery(settings).tasks[COMPUTE_PLACEMENT_TASK]()
        table = store.read()
        assert table is not None and table.version == version >= 1 and table.rows == {}
        assert any(w.base_model == settings.base_model_name for w in table.workers)
    finally:
        for worker in directory.list_live():
            directory.remove(worker.worker_id)
        prefix = f"{settings.jobs.celery_key_prefix}{settings.placement.key_prefix}"
        client.delete(prefix + "table", prefix + "version")


def test_http_dropper_posts_the_key_with_the_internal_token() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"dropped": json.loads(request.content)["adapter_key"] == "idle"})

    drop = http_dropper("secret", client=httpx.Client(transport=httpx.MockTransport(handle)))
    record = WorkerRecord("w1", "http://w1.test:8100/", "base")
    assert drop(record, "idle") is True
    assert drop(record, "busy") is False
    assert str(seen[0].url) == "http://w1.test:8100/internal/v1/adapters/drop"
    assert seen[0].headers["authorization"] == "Bearer secret"
