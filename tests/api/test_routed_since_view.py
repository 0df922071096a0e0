"""Herding on a cached worker view: the API counts what it routed since each view was published
(api/routed_since_view.py), so a burst spreads over the workers instead of piling onto the least-loaded one."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from api.routed_since_view import RoutedSinceView
from api.worker_client import WorkerClient, WorkerStream, choose_worker
from cluster.membership import WorkerRecord
from cluster.protocol import GenerateRequest
from scheduler.core.scheduler_stats import SchedulerStats
from scheduler.routing.router import RouteRequest
from scheduler.routing.router_policies import make_router

ROUTE = RouteRequest("base", "acme/a", 10, 4, adapter_rank=8, tenant_id="t1")


def records(num_workers: int, max_num_seqs: int = 16, num_running: int = 0) -> list[WorkerRecord]:
    """Identical workers as one stale listing shows them (same load, the adapter nowhere)."""
    return [
        WorkerRecord(
            f"w{i}",
            f"http://w{i}",
            "base",
            max_num_seqs=max_num_seqs,
            scheduler=SchedulerStats(num_running=num_running),
        )
        for i in range(num_workers)
    ]


def fake_workers(failing: frozenset[str] = frozenset()) -> httpx.MockTransport:
    """Workers that stream one delta and a final event; those in `failing` answer 503."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.host in failing:
            return httpx.Response(503, text="overloaded")
        lines = [
            {"type": "delta", "text": "a", "token_ids": [5]},
            {"type": "final", "finish_reason": "length"},
        ]
        return httpx.Response(200, content="".join(json.dumps(e) + "\n" for e in lines).encode())

    return httpx.MockTransport(handle)


def burst(
    policy: str, listing: list[WorkerRecord], num_requests: int, failing: frozenset[str] = frozenset()
) -> tuple[Counter[str], WorkerClient, list[WorkerStream]]:
    """Route `num_requests` through one WorkerClient on the same (stale) listing, streams left open."""

    async def run() -> tuple[Counter[str], WorkerClient, list[WorkerStream]]:
        client = WorkerClient.create("token", transport=fake_workers(failing), router=make_router(policy))
        streams = [
            await client.start(ROUTE, listing, GenerateRequest(request_id=f"r{i}", prompt="x"))
            for i in range(num_requests)
        ]
        await client.aclose()
        return Counter(s.worker_id for s in streams), client, streams

    return asyncio.run(run())


def test_burst_on_a_stale_view_spreads_over_the_workers() -> None:
    # Without the count every request of the burst goes to w0, the least-loaded worker of the cached view.
    by_worker, _, _ = burst("holders_least_loaded", records(4), 40)
    assert sorted(by_worker) == ["w0", "w1", "w2", "w3"]
    assert max(by_worker.values()) / (40 / 4) <= 1.2, by_worker


def test_without_the_count_the_stale_view_herds() -> None:
    # What the count fixes: the router alone, on the same cached views, picks one worker for the whole burst.
    router = make_router("holders_least_loaded")
    chosen = {choose_worker(router, ROUTE, records(4)).worker_id for _ in range(20)}  # type: ignore[union-attr]
    assert chosen == {"w0"}


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(["holders_least_loaded", "residency_least_loaded"]),
    num_workers=st.integers(2, 6),
    max_num_seqs=st.integers(1, 64),
    num_running=st.integers(0, 8),
    num_requests=st.integers(1, 60),
)
def test_every_least_loaded_policy_spreads_a_burst_within_its_load_gap(
    policy: str, num_workers: int, max_num_seqs: int, num_running: int, num_requests: int
) -> None:
    # (rank_aware is left out: its cost trades load against the rank a batch runs, not load alone)
    listing = records(num_workers, max_num_seqs, num_running)
    routed_since = RoutedSinceView()
    router = make_router(policy)
    counts: Counter[str] = Counter()
    for _ in range(num_requests):
        chosen = choose_worker(router, ROUTE, listing, routed_since=routed_since)
        assert chosen is not None
        routed_since.routed(chosen, ROUTE)
        counts[chosen.worker_id] += 1
    # holders_least_loaded may go past the least-loaded worker by its band (0.0625 of the batch slots)
    band = int(0.0625 * max_num_seqs) if policy == "holders_least_loaded" else 0
    assert max(counts.values()) - min(counts[r.worker_id] for r in listing) <= band + 1, counts


def test_count_is_in_the_view_until_a_new_heartbeat_and_kept_on_a_reread() -> None:
    listing = records(2)
    routed_since = RoutedSinceView()
    routed_since.views(listing)
    first = routed_since.routed(listing[0], ROUTE)
    routed_since.routed(listing[0], ROUTE)
    reread = [r.model_copy() for r in listing]  # the listing read again, the workers not heartbeated since
    views = {v.worker_id: v for v in routed_since.views(reread)}
    assert views["w0"].num_waiting == 2 and views["w0"].waiting_ranks == (8, 8)
    assert views["w0"].num_waiting_prompt_tokens == 20 and views["w0"].num_waiting_by_tenant == {"t1": 2}
    assert views["w1"].num_waiting == 0
    heartbeat = [records(1, num_running=2)[0], reread[1]]  # w0 published a state that shows both requests
    assert routed_since.views(heartbeat)[0].num_waiting == 0
    routed_since.finished(first)  # counted before that heartbeat: not subtracted from the new view
    assert routed_since.views(heartbeat)[0].num_running == 2


def test_a_finished_request_leaves_the_count_once() -> None:
    listing = records(1)
    routed_since = RoutedSinceView()
    routed_since.views(listing)
    first = routed_since.routed(listing[0], ROUTE)
    routed_since.routed(listing[0], ROUTE)
    routed_since.finished(first)
    routed_since.finished(first)
    assert routed_since.views(listing)[0].num_waiting == 1


def test_closing_streams_and_failed_starts_leave_the_count() -> None:
    # w0 answers 503: every request retried on w1 is counted there only.
    by_worker, client, streams = burst("residency_least_loaded", records(2), 4, failing=frozenset({"w0"}))
    assert by_worker == {"w1": 4}
    views = {v.worker_id: v for v in client.routed_since.views(records(2))}
    assert views["w0"].num_waiting == 0 and views["w1"].num_waiting == 4

    async def close_all() -> None:
        for stream in streams:
            await stream.aclose()

    asyncio.run(close_all())
    assert all(v.num_waiting == 0 for v in client.routed_since.views(records(2)))
