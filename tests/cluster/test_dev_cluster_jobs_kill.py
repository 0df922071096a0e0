"""kill -9 of the Celery job runner in the middle of a validation job, on a real dev-cluster (PostgreSQL, Redis,
S3 via moto, Celery): the task was taken but never acknowledged (acks late), so Redis delivers it again once
LORAHOST_CELERY_VISIBILITY_TIMEOUT_S has passed; the restarted runner validates the version to `ready`. Nothing
is left `validating`, and the version's blobs are its final ones only (no staging blob is left behind).

The job runner reaches S3 through a fault proxy that delays every chunk, so the kill lands while the job is
downloading the staged files (asserted: the version is still `validating` after the kill, and the task was
received by the killed runner and not finished there)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import boto3
import httpx
import pytest

from benchmarks.fault_proxy import FaultProxy
from tests.cluster.cluster_client import (
    ADAPTER_FILES,
    CLUSTER_ENV,
    cluster_config,
    new_tenant,
    running_cluster,
)
from tests.polling import wait_for
from tests.registry.db_fixtures import redis_url, s3_endpoint  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow  # starts a dev cluster whose job runner is killed

VISIBILITY_TIMEOUT_S = 3.0
# Redis restores unacknowledged tasks older than the visibility timeout; live runners look every second here
# (jobs/celery_client.py redelivery_options); and a loaded machine's start of the new runner
MAX_REDELIVERY_S = VISIBILITY_TIMEOUT_S + 1 + 60
S3_CHUNK_DELAY_S = 1.0
RECEIVED = re.compile(r"Task lorahost\.validate_adapter_version\[([0-9a-f-]+)\] received")


@pytest.fixture
def s3_proxy(s3_endpoint: str) -> Iterator[FaultProxy]:  # noqa: F811
    address = urlparse(s3_endpoint)
    proxy = FaultProxy(address.hostname or "127.0.0.1", address.port or 80)
    yield proxy
    proxy.close()


def _version(api_url: str, key: str, name: str) -> dict[str, object]:
    response = httpx.get(
        f"{api_url}/v1/adapters/{name}/versions", headers={"Authorization": f"Bearer {key}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    (version,) = response.json()["data"]
    return dict(version)


def _blob_keys(endpoint: str, bucket: str, prefix: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in listing.get("Contents", []))


def test_kill_9_the_job_runner_mid_validation_the_job_runs_again_and_the_version_becomes_ready(
    tmp_path: Path,
    base_model_dir: Path,
    redis_url: str,  # noqa: F811
    s3_endpoint: str,  # noqa: F811
    s3_proxy: FaultProxy,
    adapter_dirs: dict[str, Path],
) -> None:
    config = cluster_config(
        tmp_path / "cluster", base_model_dir, redis_url, num_api=1, num_workers=0, s3_endpoint=s3_endpoint,
        env={**CLUSTER_ENV, "LORAHOST_CELERY_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S)},
        jobs_env={"LORAHOST_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_proxy.port}"},
    )  # fmt: skip
    with running_cluster(config) as cluster:
        _, key = new_tenant(cluster)
        adapter_dir = next(iter(adapter_dirs.values()))
        s3_proxy.delay_s = S3_CHUNK_DELAY_S
        files = [("files", (n, (adapter_dir / n).read_bytes())) for n in ADAPTER_FILES]
        response = httpx.post(
            f"{cluster.api_url}/v1/adapters",
            headers={"Authorization": f"Bearer {key}"},
            data={"name": "killed-mid-job"},
            files=files,
            timeout=60,
        )
        assert response.status_code == 202, response.text
        jobs = cluster.jobs
        assert jobs is not None
        assert wait_for(lambda: RECEIVED.search(jobs.log_tail(max_chars=1 << 20)) is not None, timeout_s=60)
        match = RECEIVED.search(jobs.log_tail(max_chars=1 << 20))
        assert match is not None
        task_id = match.group(1)

        cluster.kill_jobs()
        killed_log = jobs.log_tail(max_chars=1 << 20)
        assert f"[{task_id}] succeeded" not in killed_log, (
            "the job finished before the kill: nothing was tested"
        )
        assert _version(cluster.api_url, key, "killed-mid-job")["status"] == "validating"

        s3_proxy.delay_s = 0.0
        restarted = cluster.restart_jobs()
        assert wait_for(
            lambda: _version(cluster.api_url, key, "killed-mid-job")["status"] != "validating",
            timeout_s=MAX_REDELIVERY_S,
        ), "the killed runner's task was never delivered again"
        version = _version(cluster.api_url, key, "killed-mid-job")
        assert version["status"] == "ready", version
        # the same task, delivered again
        assert f"[{task_id}] received" in restarted.log_tail(max_chars=1 << 20)
        blobs = _blob_keys(s3_endpoint, config.bucket, cluster.run_id + "/")
        assert blobs and all("/adapters/" in key_ for key_ in blobs), blobs  # no staging blob left behind
