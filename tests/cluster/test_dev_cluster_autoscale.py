"""`dev-cluster --autoscale` end to end: the real GET /v1/admin/scaling drives the process scaler. From zero
workers, a waiting request asks for a worker (scale from zero within the cold-start timeout); once the model
has been idle past scale_to_zero_idle_s, the worker is drained and the cluster is back at zero."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.cluster.cluster_client import (
    BASE_MODEL,
    CLUSTER_ENV,
    Load,
    cluster_config,
    new_tenant,
    running_cluster,
    usage_rows,
)
from tests.registry.db_fixtures import redis_url  # noqa: F401 - fixture

pytestmark = pytest.mark.slow  # starts a dev cluster: API, worker and Celery processes

IDLE_S = 4.0
SCALER_ENV = {
    "LORAHOST_COLD_START_TIMEOUT_S": "120",
    "LORAHOST_SCALE_TO_ZERO_IDLE_S": str(IDLE_S),
    "LORAHOST_SCALE_DOWN_COOLDOWN_S": str(IDLE_S),
    "LORAHOST_PLACEMENT_INTERVAL_S": "1",  # the placement job publishes each model's last request
    "LORAHOST_ROUTING_TABLE_REFRESH_S": "1",
}


def test_the_scaler_starts_a_worker_for_a_waiting_request_and_scales_back_to_zero_when_idle(
    tmp_path: Path,
    base_model_dir: Path,
    redis_url: str,  # noqa: F811
) -> None:
    config = cluster_config(tmp_path, base_model_dir, redis_url, num_api=2, num_workers=0, is_autoscale=True,
                            scaler_interval_s=0.5, max_workers=2, env=CLUSTER_ENV | SCALER_ENV)  # fmt: skip
    with running_cluster(config) as cluster:
        tenant_id, key = new_tenant(cluster)
        assert cluster.worker_ids() == []
        load = Load()
        load.start(cluster, key, BASE_MODEL, is_stream=True, max_tokens=8, seed=1)
        [outcome] = load.join()
        assert outcome.is_ok and outcome.num_token_chunks == 8, outcome
        [row] = usage_rows(cluster.database_url or "", tenant_id)
        assert row.status == "ok" and row.worker_id is not None and (row.ttft_ms or 0) > 0
        assert cluster.scaler is not None and cluster.scaler.last_target is not None

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (cluster.worker_ids() or cluster.live_worker_ids()):
            time.sleep(0.5)
        target = cluster.scaler.last_target
        assert cluster.worker_ids() == [] and cluster.live_worker_ids() == [], target
        assert target.desired_workers == 0, target
