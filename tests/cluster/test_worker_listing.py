"""cluster/worker_listing.py: the API's cached worker view (one directory read per TTL, the last view when it
fails), and the routing fields of heartbeat records."""

from __future__ import annotations

import json
import logging

import pytest

from cluster.membership import InMemoryWorkerDirectory, RedisWorkerDirectory, WorkerRecord
from cluster.protocol import EngineSummary
from cluster.worker_listing import CachedWorkerListing
from scheduler.core.scheduler_stats import SchedulerStats
from tests.services import redis_with_prefix


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class CountingDirectory(InMemoryWorkerDirectory):
    """An in-memory directory that counts reads and can be made to fail like an unreachable Redis."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.num_reads = 0
        self.is_down = False

    def list_live(self) -> list[WorkerRecord]:
        self.num_reads += 1
        if self.is_down:
            raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")
        return super().list_live()


def _record(worker_id: str, running: int = 0) -> WorkerRecord:
    return WorkerRecord(
        worker_id, f"http://{worker_id}", "base", scheduler=SchedulerStats(num_running=running)
    )


def test_listing_is_read_once_per_ttl() -> None:
    clock = FakeClock()
    directory = CountingDirectory(clock)
    directory.heartbeat(_record("w1"), ttl_s=6)
    listing = CachedWorkerListing(0.5, clock=clock)
    assert [r.worker_id for r in listing.list_live(directory)] == ["w1"]
    directory.heartbeat(_record("w2"), ttl_s=6)
    assert [r.worker_id for r in listing.list_live(directory)] == ["w1"]  # cached
    assert listing.fresh(directory) is not None and directory.num_reads == 1
    clock.now += 0.5
    assert listing.fresh(directory) is None
    assert [r.worker_id for r in listing.list_live(directory)] == ["w1", "w2"]
    assert directory.num_reads == 2


def test_a_worker_that_stops_heartbeating_leaves_within_the_cache_ttl_of_its_expiry() -> None:
    clock = FakeClock()
    directory = CountingDirectory(clock)
    directory.heartbeat(_record("w1"), ttl_s=6)
    directory.heartbeat(_record("w2"), ttl_s=6)
    listing = CachedWorkerListing(0.5, clock=clock)
    listing.list_live(directory)
    clock.now += 5
    directory.heartbeat(_record("w2"), ttl_s=6)  # w1 misses its beats
    clock.now += 1.5  # w1's record expired 0.5 s ago
    assert [r.worker_id for r in listing.list_live(directory)] == ["w2"]


def test_a_failing_directory_keeps_the_last_view_logs_once_and_retries_once_per_ttl(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    directory = CountingDirectory(clock)
    directory.heartbeat(_record("w1", running=3), ttl_s=60)
    listing = CachedWorkerListing(0.5, clock=clock)
    listing.list_live(directory)
    directory.is_down = True
    caplog.set_level(logging.WARNING, logger="lorahost.cluster")
    for _ in range(5):
        clock.now += 0.5
        for _ in range(10):  # ten requests per TTL: one read attempt
            records = listing.list_live(directory)
            assert [(r.worker_id, r.scheduler.num_running) for r in records] == [("w1", 3)]
    assert listing.is_stale
    assert directory.num_reads == 1 + 5
    unreadable = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(unreadable) == 1 and "ConnectionError" in unreadable[0].getMessage()
    directory.is_down = False
    directory.heartbeat(_record("w2"), ttl_s=60)
    clock.now += 0.5
    assert [r.worker_id for r in listing.list_live(directory)] == ["w1", "w2"]
    assert not listing.is_stale
    assert any("readable again" in r.getMessage() for r in caplog.records)


def test_a_directory_that_fails_from_the_start_gives_an_empty_view() -> None:
    clock = FakeClock()
    directory = CountingDirectory(clock)
    directory.is_down = True
    assert CachedWorkerListing(0.5, clock=clock).list_live(directory) == []


def test_a_new_directory_object_is_read_not_served_from_the_old_cache() -> None:
    clock = FakeClock()
    first, second = CountingDirectory(clock), CountingDirectory(clock)
    first.heartbeat(_record("w1"), ttl_s=6)
    second.heartbeat(_record("w2"), ttl_s=6)
    listing = CachedWorkerListing(0.5, clock=clock)
    listing.list_live(first)
    assert listing.fresh(second) is None
    assert [r.worker_id for r in listing.list_live(second)] == ["w2"]


def test_zero_ttl_reads_every_time() -> None:
    clock = FakeClock()
    directory = CountingDirectory(clock)
    listing = CachedWorkerListing(0.0, clock=clock)
    listing.list_live(directory)
    listing.list_live(directory)
    assert directory.num_reads == 2


def test_routing_fields_round_trip_through_redis() -> None:
    gen = redis_with_prefix()
    client, prefix = next(gen)
    try:
        directory = RedisWorkerDirectory(client, key_prefix=prefix)
        record = WorkerRecord(
            "w1",
            "http://w1",
            "base",
            perf_model={"version": 1},
            scheduler=SchedulerStats(
                adapter_ranks={"a": 64},
                running_ranks=(64, 0),
                waiting_ranks=(8,),
                num_waiting_prompt_tokens=12,
                num_waiting_by_queue=(1,),
            ),
            engine=EngineSummary(decode_step_ms=9.5, prefill_step_ms=None),
        )
        directory.heartbeat(record, ttl_s=30)
        assert directory.list_live() == [record]
    finally:
        gen.close()


def test_records_of_older_workers_parse_with_the_routing_defaults() -> None:
    raw = json.dumps({"worker_id": "w1", "url": "http://w1", "base_model": "base", "num_running": 2})
    record = WorkerRecord.from_json(raw)
    core = record.scheduler
    assert core.num_running == 2 and core.running_ranks == () and core.adapter_ranks == {}
    assert record.perf_model is None and record.engine.decode_step_ms is None
    assert core.num_waiting_by_queue == ()
