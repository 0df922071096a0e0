"""A dev-cluster that starts with no worker: a request waits through the cold start until the process scaler
starts one; scale-down to zero drains it; a dead worker still in the routing view is retried around."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorahost.dev_cluster import DevCluster
from lorahost.scaler import ProcessScaler, ScalingTarget
from tests.cluster.cluster_client import (
    BASE_MODEL,
    CLUSTER_ENV,
    Load,
    cluster_config,
    new_tenant,
    running_cluster,
    usage_rows,
)
from tests.polling import wait_for
from tests.registry.db_fixtures import redis_url  # noqa: F401 - fixture

pytestmark = pytest.mark.slow  # starts a dev cluster whose workers are started and killed

DEAD_WORKER_TTL_S = 30.0  # a killed worker stays in the routing view this long (its record's TTL)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
    base_model_dir: Path,
    redis_url: str,  # noqa: F811
) -> Iterator[DevCluster]:
    """One API replica, no worker, no jobs; worker records live DEAD_WORKER_TTL_S after their last beat."""
    env = CLUSTER_ENV | {
        "LORAHOST_HEARTBEAT_TTL_S": str(DEAD_WORKER_TTL_S),
        "LORAHOST_COLD_START_TIMEOUT_S": "90",
    }
    config = cluster_config(
        tmp_path_factory.mktemp("cold"), base_model_dir, redis_url, num_api=1, num_workers=0,
        is_jobs_enabled=False, env=env,
    )  # fmt: skip
    with running_cluster(config) as running:
        yield running


class Desired:
    """A scaling answer set by the test (stands in for GET /v1/admin/scaling)."""

    def __init__(self) -> None:
        self.num_workers = 0

    def __call__(self) -> ScalingTarget:
        return ScalingTarget(base_model=BASE_MODEL, desired_workers=self.num_workers, reason="test")


def test_a_request_with_no_live_worker_waits_for_the_scaler_to_start_one_then_scale_to_zero_drains_it(
    cluster: DevCluster,
) -> None:
    tenant_id, key = new_tenant(cluster)
    desired = Desired()
    scaler = ProcessScaler(desired, cluster, max_workers=2)
    assert cluster.live_worker_ids() == [] and scaler.step().is_noop

    load = Load()
    load.start(cluster, key, BASE_MODEL, is_stream=True, max_tokens=8, seed=1)
    assert wait_for(
        lambda: any(r.status == "in_progress" for r in usage_rows(cluster.database_url or "", tenant_id))
    )
    desired.num_workers = 1  # the demand the scaling endpoint would report
    assert scaler.step().num_to_start == 1
    [outcome] = load.join()
    assert outcome.is_ok and outcome.num_token_chunks == 8, outcome
    [row] = usage_rows(cluster.database_url or "", tenant_id)
    assert (row.status, row.completion_tokens, row.worker_id) == ("ok", 8, cluster.worker_ids()[0])

    desired.num_workers = 0
    assert len(scaler.step().stop_ids) == 1 and cluster.worker_ids() == []
    assert wait_for(lambda: cluster.live_worker_ids() == [])  # drained and deregistered


def test_a_worker_killed_before_the_first_token_is_retried_on_another(cluster: DevCluster) -> None:
    tenant_id, key = new_tenant(cluster)
    first = cluster.start_worker()
    second = cluster.start_worker()
    cluster.wait_live_workers(lambda ids: {first.worker_id, second.worker_id} <= set(ids))
    cluster.kill_worker(first.worker_id, signal.SIGKILL)
    assert first.worker_id in cluster.live_worker_ids()  # still in the view: its record outlives it

    load = Load()
    for seed in range(4):
        load.start(cluster, key, BASE_MODEL, is_stream=seed % 2 == 0, max_tokens=6, seed=seed)
    outcomes = load.join()
    assert all(o.is_ok for o in outcomes), outcomes
    assert first.worker_id in cluster.live_worker_ids()  # served while the dead worker was still routable
    rows = usage_rows(cluster.database_url or "", tenant_id)
    assert len(rows) == 4 and {(r.status, r.worker_id) for r in rows} == {("ok", second.worker_id)}
    api_log = (cluster.data_dir / "logs" / "api-0.log").read_text()
    assert f"worker {first.worker_id} unreachable" in api_log  # the router tried the dead worker first


def test_the_scaler_reads_the_real_api_and_keeps_the_workers_without_an_answer(cluster: DevCluster) -> None:
    from lorahost.scaler import fetch_scaling

    target = fetch_scaling(cluster.api_url, cluster.admin_key, BASE_MODEL)
    # None until the API serves GET /v1/admin/scaling (404 is tolerated); then the answer for the base model
    assert target is None or (target.base_model == BASE_MODEL and target.desired_workers >= 0)
    before = cluster.worker_ids()
    if target is None:
        assert ProcessScaler(lambda: fetch_scaling(cluster.api_url, cluster.admin_key, BASE_MODEL), cluster,
                             max_workers=2).step().is_noop  # fmt: skip
        assert cluster.worker_ids() == before
