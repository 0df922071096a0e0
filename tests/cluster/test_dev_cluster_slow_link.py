"""A slow, flapping or silent link between the API and a worker, on a real dev-cluster (an API replica, a worker
registered behind a TCP fault proxy, Celery, PostgreSQL, Redis, S3).

Asserted, per round (a delay on every chunk, then every connection reset while streams flow):
- every request ends cleanly: completed, or a clear error (an SSE `error` event then [DONE] for a stream, a JSON
  error otherwise); the client's connection never breaks and no request hangs;
- once the link is restored, new requests complete;
- usage: one row per request, none left `in_progress`, a broken stream billed what its client received;
- no leak: neither the API process nor the worker holds a connection its peer closed (CLOSE_WAIT); every
  connection through the link is one the API holds in its pool, at most one per request of a round. (Threads are
  not compared: the API's thread pool grows on demand up to its cap, more under a loaded machine; the soak,
  benchmarks/soak.py, watches threads over time.)

And a link that goes silent without a reset (a partition) ends its streams with a worker error once they were
silent for LORAHOST_WORKER_READ_TIMEOUT_S (none hangs); the link back, requests complete. (That a request waiting
its turn longer than the read timeout is kept alive by the worker's keepalive lines: tests/api/
test_worker_client_keepalive.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from benchmarks.fault_proxy import FaultProxy
from lorahost.processes import free_port
from tests.cluster.cluster_client import (
    BASE_MODEL,
    CLUSTER_ENV,
    Load,
    Outcome,
    cluster_config,
    new_tenant,
    running_cluster,
    send,
    usage_rows,
)
from tests.polling import wait_for
from tests.registry.db_fixtures import redis_url  # noqa: F401 - fixture

pytestmark = pytest.mark.slow  # starts a dev cluster whose worker link is slowed and reset

NUM_ROUNDS = 3
NUM_REQUESTS = 6  # a round's requests: half streamed
MAX_TOKENS = 600
CHUNK_DELAY_S = 0.02  # every chunk either way: ~50 tokens/s at most through the link


@pytest.fixture
def worker_port() -> int:
    return free_port("127.0.0.1")


@pytest.fixture
def link(worker_port: int) -> Iterator[FaultProxy]:
    proxy = FaultProxy("127.0.0.1", worker_port)
    yield proxy
    proxy.close()


def _sockets(pid: int, status: str, remote_port: int | None = None) -> list[tuple[object, object]]:
    """The process's TCP connections in `status` (to remote_port when given), as (local, remote) addresses."""
    return [
        (c.laddr, c.raddr)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == status and (remote_port is None or (c.raddr and c.raddr.port == remote_port))
    ]


def _round(cluster, key: str, link: FaultProxy, seed0: int) -> list[Outcome]:  # type: ignore[no-untyped-def]
    """Requests over a slowed link, reset once streams deliver; returns what the clients received."""
    link.delay_s = CHUNK_DELAY_S
    load = Load()
    for i in range(NUM_REQUESTS):
        load.start(cluster, key, BASE_MODEL, is_stream=i % 2 == 0, max_tokens=MAX_TOKENS, seed=seed0 + i)
    assert wait_for(lambda: load.num_streamed_tokens() >= 3, timeout_s=60), (
        "no stream delivered through the link"
    )
    link.cut()  # every connection through the link reset, as a flapping network does
    link.restore()
    link.delay_s = 0.0
    return load.join()


def test_a_slow_flapping_worker_link_ends_every_request_cleanly_and_leaks_nothing(
    tmp_path: Path,
    base_model_dir: Path,
    redis_url: str,  # noqa: F811
    worker_port: int,
    link: FaultProxy,
) -> None:
    config = cluster_config(tmp_path / "cluster", base_model_dir, redis_url, num_api=1, num_workers=0)
    with running_cluster(config) as cluster:
        worker = cluster.start_worker(port=worker_port, advertise_url=f"http://127.0.0.1:{link.port}")
        tenant_id, key = new_tenant(cluster)
        api_pid = cluster.apis[0].pid
        outcomes: list[Outcome] = []
        for n in range(NUM_ROUNDS):
            round_outcomes = _round(cluster, key, link, seed0=100 * n)
            outcomes += round_outcomes
            for out in round_outcomes:
                assert out.transport_error is None, out
                assert out.is_ok or out.error is not None, out
                assert out.status_code is not None and (out.status_code < 500 or out.error), out
            assert any(out.error is not None for out in round_outcomes), "the reset broke nothing: not tested"
            after = Load()
            for i in range(2):
                after.start(cluster, key, BASE_MODEL, is_stream=i == 0, max_tokens=8, seed=100 * n + 50 + i)
            assert all(out.is_ok for out in after.join()), "requests after the link came back failed"
        for pid in (api_pid, worker.process.pid):  # a leak stays; a socket whose EOF is being handled goes
            assert wait_for(lambda pid=pid: _sockets(pid, "CLOSE_WAIT") == [], timeout_s=10), (
                f"a connection its peer closed is still held: {_sockets(pid, 'CLOSE_WAIT')}"
            )
        # every connection the link carries is one the API holds (idle in its pool, at most one per request of
        # a round): none was orphaned on either side
        assert wait_for(
            lambda: link.num_open() == 2 * len(_sockets(api_pid, "ESTABLISHED", link.port)), timeout_s=10
        )
        assert len(_sockets(api_pid, "ESTABLISHED", link.port)) <= NUM_REQUESTS

        database_url = cluster.database_url or ""
        assert wait_for(
            lambda: all(r.status != "in_progress" for r in usage_rows(database_url, tenant_id)), timeout_s=30
        )
        all_rows = usage_rows(database_url, tenant_id)
        rows = {r.request_id: r for r in all_rows}
        assert len(rows) == len(all_rows), "a request has two usage rows"
        for out in outcomes:
            if out.request_id is None:
                continue  # refused before any id was given (no worker reachable): no row, nothing billed
            row = rows[out.request_id]
            if out.is_stream and out.error is not None:
                assert row.completion_tokens == out.num_token_chunks, (out, row)


READ_TIMEOUT_S = 2.0  # the API gives up a worker stream silent this long (LORAHOST_WORKER_READ_TIMEOUT_S)
KEEPALIVE_S = 0.2  # the worker's blank line in a silent stream (LORAHOST_STREAM_KEEPALIVE_S)
LONG_TOKENS = 1000  # near the tiny model's 1,024 positions: still flowing when the link goes silent


def test_a_link_that_goes_silent_without_a_reset_ends_its_streams_with_an_error(
    tmp_path: Path,
    base_model_dir: Path,
    redis_url: str,  # noqa: F811
    worker_port: int,
    link: FaultProxy,
) -> None:
    env = {**CLUSTER_ENV, "LORAHOST_WORKER_READ_TIMEOUT_S": str(READ_TIMEOUT_S),
           "LORAHOST_STREAM_KEEPALIVE_S": str(KEEPALIVE_S)}  # fmt: skip
    config = cluster_config(
        tmp_path / "cluster", base_model_dir, redis_url, num_api=1, num_workers=0, env=env
    )
    with running_cluster(config) as cluster:
        cluster.start_worker(port=worker_port, advertise_url=f"http://127.0.0.1:{link.port}")
        _, key = new_tenant(cluster)
        # one stream, stalled once it delivers: a request that had not started yet would instead be held for a
        # worker (the cold-start wait), which is not what this test is about
        silent = Load()
        silent.start(cluster, key, BASE_MODEL, is_stream=True, max_tokens=LONG_TOKENS, seed=0)
        assert wait_for(lambda: silent.num_streamed_tokens() > 0, timeout_s=60)
        link.is_stalled = True  # nothing passes, nothing is closed: a partition
        (outcome,) = silent.join()
        link.is_stalled = False
        assert outcome.transport_error is None, outcome
        assert outcome.error is not None and outcome.error["type"] == "worker_error", outcome
        assert outcome.is_done  # the stream's error event, then [DONE]
        after = send(cluster.api_url, key, BASE_MODEL, is_stream=True, max_tokens=4, seed=9)
        assert after.is_ok, after
