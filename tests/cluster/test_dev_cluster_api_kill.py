"""kill -9 of an API replica with streams on it, on a real dev-cluster (2 API replicas, a worker, Celery,
PostgreSQL, Redis, S3): the other replica keeps serving; the dead one's streams break (their client's connection is
gone with the process) and are billed as of their last checkpoint, never more than their clients received and
at most a checkpoint interval behind; the replica, restarted under its api_instance_id, closes those rows as
`interrupted` before it serves; no request has two rows."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from registry.usage import as_utc
from tests.cluster.cluster_client import (
    BASE_MODEL,
    CLUSTER_ENV,
    Outcome,
    cluster_config,
    new_tenant,
    running_cluster,
    send,
    usage_rows,
)
from tests.polling import wait_for
from tests.registry.db_fixtures import redis_url  # noqa: F401 - fixture

pytestmark = pytest.mark.slow  # starts a dev cluster whose API replica is killed

NUM_STREAMS = 3
CHECKPOINT_S = float(CLUSTER_ENV["LORAHOST_USAGE_CHECKPOINT_INTERVAL_S"])
# how far a broken stream's last checkpoint may lie before the kill: one interval, one write, and a busy
# machine's scheduling (a bound of the protocol, not a speed)
MAX_CHECKPOINT_AGE_S = CHECKPOINT_S + 2.5


def _stream_to(api_url: str, key: str, seed: int, max_tokens: int) -> tuple[Outcome, threading.Thread]:
    outcome = Outcome(model=BASE_MODEL, is_stream=True)
    thread = threading.Thread(
        target=send, args=(api_url, key, BASE_MODEL), kwargs={"is_stream": True, "max_tokens": max_tokens,
                                                               "seed": seed, "out": outcome}, daemon=True,
    )  # fmt: skip
    thread.start()
    return outcome, thread


def test_kill_9_an_api_replica_the_other_serves_and_its_streams_are_billed_to_their_checkpoint(
    tmp_path: Path,
    base_model_dir: Path,
    redis_url: str,  # noqa: F811
) -> None:
    config = cluster_config(tmp_path / "cluster", base_model_dir, redis_url, num_api=2, num_workers=1)
    with running_cluster(config) as cluster:
        tenant_id, key = new_tenant(cluster)
        victim_url, other_url = cluster.apis[1].url or "", cluster.apis[0].url or ""
        # near the tiny model's 1,024 positions: still running at the kill
        doomed = [_stream_to(victim_url, key, seed, max_tokens=1000) for seed in range(NUM_STREAMS)]
        database_url = cluster.database_url or ""

        def checkpointed() -> bool:
            rows = usage_rows(database_url, tenant_id)
            return len(rows) == NUM_STREAMS and all(r.completion_tokens > 0 for r in rows)

        assert wait_for(checkpointed, timeout_s=60), [o for o, _ in doomed]
        cluster.kill_api(1)
        killed_at = datetime.now(UTC)
        for _, thread in doomed:
            thread.join(30)
        served = [_stream_to(other_url, key, 100 + seed, max_tokens=8) for seed in range(2)]
        for _, thread in served:
            thread.join(60)
        assert all(outcome.is_ok for outcome, _ in served), [o for o, _ in served]
        broken = [outcome for outcome, _ in doomed]
        assert all(not o.is_ok for o in broken), broken  # the kill met them mid-stream

        cluster.restart_api(1)
        rows = {r.request_id: r for r in usage_rows(database_url, tenant_id)}
        assert len(rows) == NUM_STREAMS + 2  # one row per request, none twice after the restart
        for outcome in broken:
            row = rows[outcome.request_id or ""]
            assert row.status == "interrupted", row.status
            assert 0 < row.completion_tokens <= outcome.num_token_chunks, (row.completion_tokens, outcome)
            assert (killed_at - as_utc(row.checkpointed_at)).total_seconds() <= MAX_CHECKPOINT_AGE_S
        for outcome, _ in served:
            assert rows[outcome.request_id or ""].status == "ok"
        again = _stream_to(victim_url, key, 200, max_tokens=4)  # the restarted replica serves
        again[1].join(60)
        assert again[0].is_ok, again[0]
        assert len(usage_rows(database_url, tenant_id)) == NUM_STREAMS + 3
