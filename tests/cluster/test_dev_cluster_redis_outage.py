"""Redis briefly unavailable under a dev-cluster (its own redis-server, stopped and restarted empty):
inference keeps routing from the API's last worker view (cluster/worker_listing.py) with rate limits counted
in process (api/ratelimit.py), and Celery jobs resume once Redis is back."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.local_redis import LocalRedis
from lorahost.dev_cluster import DevCluster
from lorahost.processes import free_port
from tests.cluster.cluster_client import (
    BASE_MODEL,
    Load,
    cluster_config,
    new_tenant,
    running_cluster,
    upload_ready,
)
from tests.registry.db_fixtures import require_service

pytestmark = pytest.mark.slow  # starts a dev cluster and a Redis server process


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    if shutil.which("redis-server") is None:
        require_service("redis-server is not installed (the outage test runs a Redis of its own)")
    server = LocalRedis(free_port(), tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path, redis_server: LocalRedis
) -> Iterator[DevCluster]:
    config = cluster_config(tmp_path_factory.mktemp("outage"), base_model_dir, redis_server.url, num_api=1,
                            num_workers=1)  # fmt: skip
    with running_cluster(config) as running:
        yield running


def _send_all(cluster: DevCluster, key: str, num: int) -> list:  # type: ignore[type-arg]
    load = Load()
    for seed in range(num):
        load.start(cluster, key, BASE_MODEL, is_stream=seed % 2 == 0, max_tokens=6, seed=seed)
    return load.join()


def test_inference_keeps_routing_from_the_last_worker_view_while_redis_is_down(
    cluster: DevCluster, adapter_dirs: dict[str, Path], redis_server: LocalRedis
) -> None:
    _, key = new_tenant(cluster)
    assert all(o.is_ok for o in _send_all(cluster, key, 2))  # the API has seen the worker
    redis_server.stop()
    try:
        outcomes = _send_all(cluster, key, 4)
    finally:
        redis_server.start()
    assert all(o.is_ok for o in outcomes), outcomes


def test_celery_jobs_resume_after_redis_comes_back(
    cluster: DevCluster, adapter_dirs: dict[str, Path], redis_server: LocalRedis
) -> None:
    _, key = new_tenant(cluster)
    upload_ready(cluster, key, "before-outage", next(iter(adapter_dirs.values())))
    redis_server.stop()
    time.sleep(2.0)  # the Celery worker, the API and the worker all lose their connections
    redis_server.start()
    upload_ready(cluster, key, "after-outage", list(adapter_dirs.values())[1], timeout_s=90)
    cluster.wait_live_workers(lambda ids: len(ids) == 1, timeout_s=30)  # the worker re-registered
    assert all(o.is_ok for o in _send_all(cluster, key, 2))
