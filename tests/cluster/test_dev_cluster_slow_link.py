"""A slow, flapping link between the API and a worker, on a real dev-cluster (an API replica, a worker registered
behind a TCP fault proxy, Celery, PostgreSQL, Redis, S3).

Asserted, per round (a delay on every chunk, then every connection reset while streams flow):
- every request ends cleanly: completed, or a clear error (an SSE `error` event then [DONE] for a stream, a JSON
  error otherwise); the client's connection never breaks and no request hangs;
- once the link is restored, new requests complete;
- usage: one row per request, none left `in_progress`, a broken stream billed what its client received;
- no leak: the API process has no more threads after the last round than after the first; neither it nor the
  worker holds a connection its peer closed (CLOSE_WAIT); every connection through the link is one the API holds
  in its pool, at most one per request of a round.
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
    Load,
    Outcome,
    cluster_config,
    new_tenant,
    running_cluster,
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


def _num_threads(pid: int) -> int:
    return psutil.Process(pid).num_threads()


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
        after_first: int | None = None
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
            if after_first is None:
                after_first = _num_threads(api_pid)
        assert after_first is not None
        assert _num_threads(api_pid) <= after_first, "the API process gained threads over the rounds"
        for pid in (api_pid, worker.process.pid):
            assert _sockets(pid, "CLOSE_WAIT") == [], "a connection its peer closed is still held"
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
