"""The routing-table store (in memory and Redis), the API's cached copy, and the cold-start waiters store."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest

from cluster.routing_table import (
    CachedRoutingTable,
    InMemoryRoutingTableStore,
    ModelDemand,
    RedisRoutingTableStore,
    RoutingTable,
    WorkerPlacement,
)
from cluster.waiting_requests import LocalWaitingRequests, RedisWaitingRequests
from tests.registry.db_fixtures import redis_url  # noqa: F401 - fixture

TABLE = RoutingTable(
    version=0,
    computed_at=1_900_000_000.5,
    rows={"v1": (("w1", 0.25), ("w2", 0.75)), "v2": (("w2", 1.0),)},
    workers=(WorkerPlacement("w1", "base", 0.3, 8, 1), WorkerPlacement("w2", "base", 0.9, 64, 2)),
    moved=("v1",),
    demand=(ModelDemand("base", {8: 12.5, 0: 1.0}, {8: 20.0}, 1_899_999_990.0),),
)


@pytest.fixture
def redis_client(redis_url: str):  # type: ignore[no-untyped-def]  # noqa: F811
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_json_round_trip_keeps_every_field() -> None:
    assert RoutingTable.from_json(TABLE.to_json()) == TABLE


def test_in_memory_store_versions_grow() -> None:
    store = InMemoryRoutingTableStore()
    assert store.read() is None
    assert store.publish(TABLE).version == 1
    assert store.publish(TABLE).version == 2 and store.read().rows == TABLE.rows  # type: ignore[union-attr]


def test_redis_store_round_trips_and_versions_grow_across_clients(redis_client) -> None:  # type: ignore[no-untyped-def]
    import redis

    prefix = f"test-{uuid.uuid4().hex[:8]}:placement:"
    a = RedisRoutingTableStore(redis_client, prefix)
    b = RedisRoutingTableStore(redis.Redis(connection_pool=redis_client.connection_pool), prefix)
    try:
        assert a.read() is None
        assert a.publish(TABLE).version == 1 and b.publish(TABLE).version == 2
        assert a.read() == replace(TABLE, version=2)
    finally:
        redis_client.delete(prefix + "table", prefix + "version")


class FlakyStore(InMemoryRoutingTableStore):
    is_down = False

    def read(self) -> RoutingTable | None:
        if self.is_down:
            raise ConnectionError("redis away")
        return super().read()


def test_cached_copy_serves_rows_from_memory_and_keeps_the_last_view_when_the_store_fails() -> None:
    store = FlakyStore()
    cache = CachedRoutingTable(store)
    assert cache.row("v1") == () and cache.refresh() is None
    store.publish(TABLE)
    assert cache.row("v1") == ()  # not refreshed yet: no network call on the request path
    cache.refresh()
    assert (
        cache.row("v1") == (("w1", 0.25), ("w2", 0.75)) and cache.row(None) == () and cache.row("nope") == ()
    )
    store.is_down = True
    with pytest.raises(ConnectionError):
        cache.refresh()
    assert cache.row("v2") == (("w2", 1.0),)


def test_local_waiting_requests_sum_instances() -> None:
    waiting = LocalWaitingRequests()
    waiting.publish("api-1", {"base": 2, "other": 0}, 5)
    waiting.publish("api-2", {"base": 1}, 5)
    assert waiting.totals() == {"base": 3}
    waiting.publish("api-1", {}, 5)
    assert waiting.totals() == {"base": 1}


def test_redis_waiting_requests_sum_live_replicas_and_expire_dead_ones(redis_client) -> None:  # type: ignore[no-untyped-def]
    prefix = f"test-{uuid.uuid4().hex[:8]}:waiting:"
    waiting = RedisWaitingRequests(redis_client, prefix)
    try:
        assert waiting.totals() == {}
        waiting.publish("api-1", {"base": 2}, 0.2)
        waiting.publish("api-2", {"base": 1, "b2": 4}, 30)
        assert waiting.totals() == {"base": 3, "b2": 4}
        deadline = time.monotonic() + 30  # Redis expires api-1's key on its own clock: wait for it, bounded
        while waiting.totals() != {"base": 1, "b2": 4} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting.totals() == {"base": 1, "b2": 4}
        assert redis_client.smembers(prefix + "index") == {b"api-2"}
    finally:
        redis_client.delete(prefix + "api-1", prefix + "api-2", prefix + "index")
