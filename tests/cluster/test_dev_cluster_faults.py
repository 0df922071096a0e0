"""Faults on a real dev-cluster (2 API replicas, 3 worker processes, Celery, PostgreSQL, Redis, S3):
`kill -9` of a worker under a mixed streaming / non-streaming load over several adapters.

Asserted:
- no request hangs or is lost: each one completes, or ends with a clear error (an SSE `error` event then
  [DONE] for a stream; a 502 JSON `worker_error` otherwise); no connection breaks;
- the kill hit work in flight (some request ended with that error);
- requests sent right after the kill, while the dead worker may still be in the routing view, all complete
  (a worker that fails before the first token is retried on another);
- usage: exactly one row per request; a completed request is billed what it returned; a broken stream is
  billed the tokens its client received (its usage chunk says the same); a failed non-streamed request,
  which returned no text, is billed no completion tokens;
- the killed worker, restarted under the same id, rejoins and serves requests.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.cluster.cluster_client import (
    BASE_MODEL,
    Load,
    Outcome,
    cluster_config,
    new_tenant,
    running_cluster,
    upload_ready,
    usage_rows,
)
from tests.polling import wait_for
from tests.registry.db_fixtures import redis_url  # noqa: F401 - fixture

pytestmark = pytest.mark.slow  # starts a dev cluster whose worker processes are killed

NUM_ADAPTERS = 3
NUM_LOAD_REQUESTS = 12
LOAD_MAX_TOKENS = 800  # long enough that the kill lands mid-stream on a fast machine
NUM_AFTER_KILL_REQUESTS = 6
MAX_JOIN_ROUNDS = 5


def _models(names: list[str]) -> list[str]:
    return [*names, BASE_MODEL]


def _start_load(  # type: ignore[no-untyped-def]
    cluster, key: str, models: list[str], num: int, max_tokens: int, seed0: int, gap_s: float = 0.0
) -> Load:
    load = Load()
    for i in range(num):
        load.start(
            cluster, key, models[i % len(models)], is_stream=i % 2 == 0, max_tokens=max_tokens, seed=seed0 + i
        )
        time.sleep(gap_s)
    return load


def _worker_streaming_now(database_url: str, tenant_id: str) -> str:
    """The worker with the most requests that have delivered tokens and are still running (their usage rows
    are checkpointed with the worker and the tokens delivered), once there is one."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        flowing = Counter(
            r.worker_id for r in usage_rows(database_url, tenant_id)
            if r.status == "in_progress" and r.completion_tokens > 0 and r.worker_id
        )  # fmt: skip
        if flowing:
            return flowing.most_common(1)[0][0]
        time.sleep(0.05)
    raise AssertionError("no request was seen delivering tokens")


def _as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _check_clear_ending(outcome: Outcome) -> None:
    assert outcome.transport_error is None, outcome
    if outcome.is_ok:
        return
    assert outcome.error is not None, outcome
    if outcome.is_stream:
        assert outcome.status_code == 200 and outcome.is_done, outcome  # the error event, then [DONE]
        assert outcome.error["type"] == "worker_error" and "worker" in outcome.error["message"], outcome
    else:
        assert outcome.status_code == 502 and outcome.error["type"] == "worker_error", outcome


def _check_billing(outcomes: list[Outcome], rows: list) -> None:  # type: ignore[type-arg]
    by_request = {r.request_id: r for r in rows}
    assert len(by_request) == len(rows)
    assert len(rows) == len(outcomes), (len(rows), len(outcomes))  # exactly one row per request
    unmatched = dict(by_request)
    for outcome in outcomes:
        if outcome.request_id is None:
            continue
        row = unmatched.pop(outcome.request_id)
        outcome.worker_id = row.worker_id
        if outcome.is_ok:
            assert (row.status, row.completion_tokens) == ("ok", outcome.usage["completion_tokens"]), outcome  # type: ignore[index]
            if outcome.is_stream:
                assert outcome.num_token_chunks == row.completion_tokens
        else:  # a stream broken after its first token: billed what its client received
            assert outcome.is_stream and row.status == "error", (outcome, row.status)
            assert row.completion_tokens == outcome.num_token_chunks > 0, (row.completion_tokens, outcome)
            assert outcome.usage is not None and outcome.usage["completion_tokens"] == row.completion_tokens
    failed_plain = [o for o in outcomes if o.request_id is None]
    assert all(not o.is_stream and o.status_code == 502 for o in failed_plain), failed_plain
    assert len(unmatched) == len(failed_plain)
    assert all(r.status == "error" and r.completion_tokens == 0 for r in unmatched.values())


def test_kill_9_a_worker_under_load_no_request_lost_usage_once_and_the_restarted_worker_rejoins(
    tmp_path: Path,
    base_model_dir: Path,
    adapter_dirs: dict[str, Path],
    redis_url: str,  # noqa: F811
) -> None:
    config = cluster_config(tmp_path / "cluster", base_model_dir, redis_url, num_workers=3)
    with running_cluster(config) as cluster:
        tenant_id, key = new_tenant(cluster)
        names = [f"adapter-{i}" for i in range(NUM_ADAPTERS)]
        for name, adapter_dir in zip(names, list(adapter_dirs.values())[:NUM_ADAPTERS], strict=True):
            upload_ready(cluster, key, name, adapter_dir)
        models = _models(names)
        warm = _start_load(cluster, key, models, len(models), max_tokens=4, seed0=1000)
        outcomes = warm.join()
        assert all(o.is_ok for o in outcomes), outcomes

        load = _start_load(cluster, key, models, NUM_LOAD_REQUESTS, LOAD_MAX_TOKENS, seed0=0)
        load_started = time.monotonic()
        assert wait_for(lambda: load.num_streamed_tokens() > 0), "no stream got a token"
        victim = _worker_streaming_now(cluster.database_url or "", tenant_id)
        num_tokens_at_kill = load.num_streamed_tokens()
        cluster.kill_worker(victim)
        killed_after_s = time.monotonic() - load_started
        after_kill = _start_load(cluster, key, models, NUM_AFTER_KILL_REQUESTS, max_tokens=16, seed0=100)
        killed_outcomes = load.join()
        after_outcomes = after_kill.join()

        for outcome in killed_outcomes + after_outcomes:
            _check_clear_ending(outcome)
        assert any(not o.is_ok for o in killed_outcomes), "the kill hit no request in flight"
        assert all(o.is_ok for o in after_outcomes), [o for o in after_outcomes if not o.is_ok]

        cluster.start_worker(worker_id=victim)  # a restart under the same id: it must rejoin
        rejoined_at = datetime.now(UTC)
        cluster.wait_live_workers(lambda ids: victim in ids and len(ids) == 3, timeout_s=30)
        join_outcomes: list[Outcome] = []
        for round_index in range(MAX_JOIN_ROUNDS):
            # sustained base-model load (no adapter residency pulls it elsewhere): once the old workers' beats
            # show their load, a load-aware router sends the next requests to the idle joiner
            join_load = _start_load(cluster, key, [BASE_MODEL], 12, max_tokens=400,
                                    seed0=200 + 20 * round_index, gap_s=0.15)  # fmt: skip
            join_outcomes += join_load.join()
            served = {r.worker_id for r in usage_rows(cluster.database_url or "", tenant_id)
                      if _as_utc(r.started_at) >= rejoined_at}  # fmt: skip
            if victim in served:
                break
            time.sleep(0.6)  # the next round sees fresher heartbeats (loads)
        assert all(o.is_ok for o in join_outcomes), [o for o in join_outcomes if not o.is_ok]
        assert victim in served, f"the rejoined worker {victim} got no request; served: {served}"

        rows = usage_rows(cluster.database_url or "", tenant_id)
        all_outcomes = outcomes + killed_outcomes + after_outcomes + join_outcomes
        assert not [r for r in rows if r.status == "in_progress"]
        _check_billing(all_outcomes, rows)
        assert any(o.worker_id == victim and o.is_ok for o in join_outcomes)
        api_logs = (cluster.data_dir / "logs").glob("api-*")
        retries = sum(p.read_text().count(f"worker {victim} unreachable") for p in api_logs)
        num_broken = sum(not o.is_ok for o in killed_outcomes)
        print(  # shown with -s: what the kill did this run
            f"killed {victim} {killed_after_s:.1f} s into the load ({num_tokens_at_kill} tokens streamed): "
            f"{num_broken}/{len(killed_outcomes)} requests ended with an error, {retries} request(s) retried off "
            f"the dead worker, rejoined after {round_index + 1} round(s)"
        )
