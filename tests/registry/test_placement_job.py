"""The placement job end to end: usage rows (SQLite and PostgreSQL) -> forecast -> placement -> published table
(in memory and in real Redis), and the drop half of lazy migration."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from cluster.membership import InMemoryWorkerDirectory, WorkerRecord
from cluster.routing_table import InMemoryRoutingTableStore, RedisRoutingTableStore, RoutingTable
from registry import repository
from registry.models import AdapterVersion, new_id
from registry.placement_job import run_placement
from registry.usage_batches import open_usage
from scheduler.core.scheduler_stats import SchedulerStats
from settings import Settings

BASE = "lorahost-base"
NOW = datetime(2033, 6, 1, 12, 0, tzinfo=UTC)  # far from every other test's rows
SETTINGS = Settings(
    _env_file=None,
    placement_policy="loraserve",  # the placement these tests check (the default, demand_only, publishes no rows)
    placement_bucket_s=60,
    placement_history_buckets=5,
    scale_down_cooldown_s=120,
    worker_tokens_per_s=100.0,
)


def make_versions(session: Session, ranks: dict[str, int]) -> tuple[str, dict[str, AdapterVersion]]:
    tenant_id = repository.create_tenant(session, f"place-{new_id()[:8]}").id
    versions = {}
    for name, rank in ranks.items():
        adapter = repository.get_or_create_adapter(session, tenant_id, name, base_model_name=BASE)
        versions[name] = repository.add_adapter_version(
            session,
            tenant_id,
            adapter,
            status="ready",
            sha256="0" * 64,
            rank=rank,
            config_blob_key=f"k/{name}/c",
            weights_blob_key=f"k/{name}/w",
        )
    session.commit()
    return tenant_id, versions


def add_usage(
    session: Session, tenant_id: str, version: AdapterVersion | None, tokens: int, seconds_ago: float
) -> None:
    open_usage(
        session,
        [
            {
                "request_id": f"req-{new_id()}",
                "tenant_id": tenant_id,
                "adapter_version_id": version.id if version else None,
                "adapter_id": version.adapter_id if version else None,
                "model_name": BASE if version is None else "named",
                "prompt_tokens": tokens // 2,
                "completion_tokens": tokens - tokens // 2,
                "status": "ok",
                "started_at": NOW - timedelta(seconds=seconds_ago),
            }
        ],
    )
    session.commit()


def directory_with(*workers: tuple[str, tuple[str, ...]]) -> InMemoryWorkerDirectory:
    directory = InMemoryWorkerDirectory()
    for worker_id, device in workers:
        directory.heartbeat(
            WorkerRecord(
                worker_id, f"http://{worker_id}", BASE, scheduler=SchedulerStats(device_adapters=device)
            ),
            60,
        )
    return directory


def seeded(db_session_factory: sessionmaker[Session]) -> dict[str, AdapterVersion]:
    with db_session_factory() as session:
        tenant_id, versions = make_versions(session, {"hot": 8, "warm": 64, "idle": 8})
        for seconds_ago in (10, 70, 130, 190):
            add_usage(session, tenant_id, versions["hot"], 12_000, seconds_ago)
        add_usage(session, tenant_id, versions["warm"], 3_000, 20)
        add_usage(session, tenant_id, None, 600, 30)  # the base model itself
        add_usage(session, tenant_id, versions["hot"], 10**9, 3600)  # outside every window
    return versions


def check_table(table: RoutingTable, workers: set[str], expected_keys: set[str]) -> None:
    assert set(table.rows) == expected_keys
    for row in table.rows.values():
        assert row and abs(sum(w for _, w in row) - 1) < 1e-9
        assert {w for w, _ in row} <= workers


def test_job_places_forecast_demand_and_publishes(db_session_factory: sessionmaker[Session]) -> None:
    versions = seeded(db_session_factory)
    store = InMemoryRoutingTableStore()
    directory = directory_with(("w0", ()), ("w1", ()), ("w2", ()))
    table = run_placement(db_session_factory, directory, store, SETTINGS, now=NOW)
    assert table.version == 1 and store.read() == table
    check_table(table, {"w0", "w1", "w2"}, {versions["hot"].id, versions["warm"].id})
    assert len(table.rows[versions["hot"].id]) >= 2  # 200 tokens/s of rank 8 is more than one worker
    (demand,) = table.demand
    assert demand.base_model == BASE
    assert abs(demand.demand_by_rank[8] - 200.0) < 1e-6  # 12k tokens per 60 s bucket, steady
    assert abs(demand.demand_by_rank[64] - 50.0) < 1e-6  # the surge rule: the last bucket's rate
    assert abs(demand.demand_by_rank[0] - 10.0) < 1e-6
    assert demand.last_request_at == (NOW - timedelta(seconds=10)).timestamp()
    again = run_placement(db_session_factory, directory, store, SETTINGS, now=NOW)
    assert again.version == 2 and again.rows == table.rows and again.moved == ()


def test_previous_adapters_keep_one_holder_and_unready_versions_leave(
    db_session_factory: sessionmaker[Session],
) -> None:
    versions = seeded(db_session_factory)
    store = InMemoryRoutingTableStore()
    store.publish(
        RoutingTable(0, 0.0, {versions["idle"].id: (("w1", 1.0),), "deleted-version": (("w0", 1.0),)})
    )
    table = run_placement(
        db_session_factory, directory_with(("w0", ()), ("w1", ())), store, SETTINGS, now=NOW
    )
    assert table.rows[versions["idle"].id] == (("w1", 1.0),)
    assert "deleted-version" not in table.rows
    with db_session_factory() as session:
        session.get_one(AdapterVersion, versions["idle"].id).status = "failed"
        session.commit()
    table = run_placement(
        db_session_factory, directory_with(("w0", ()), ("w1", ())), store, SETTINGS, now=NOW
    )
    assert versions["idle"].id not in table.rows


def test_job_publishes_to_redis(db_session_factory: sessionmaker[Session], redis_url: str) -> None:
    import redis

    versions = seeded(db_session_factory)
    client = redis.Redis.from_url(redis_url)
    prefix = f"test-{uuid.uuid4().hex[:8]}:placement:"
    store = RedisRoutingTableStore(client, prefix)
    try:
        table = run_placement(
            db_session_factory, directory_with(("w0", ()), ("w1", ())), store, SETTINGS, now=NOW
        )
        read = RedisRoutingTableStore(redis.Redis.from_url(redis_url), prefix).read()
        assert read == table and read.version == 1
        check_table(read, {"w0", "w1"}, {versions["hot"].id, versions["warm"].id})
        assert (
            run_placement(
                db_session_factory, directory_with(("w0", ()), ("w1", ())), store, SETTINGS, now=NOW
            ).version
            == 2
        )
    finally:
        client.delete(prefix + "table", prefix + "version")


def test_old_holder_is_asked_to_drop_only_after_a_full_period(
    db_session_factory: sessionmaker[Session],
) -> None:
    versions = seeded(db_session_factory)
    hot, warm = versions["hot"].id, versions["warm"].id
    store = InMemoryRoutingTableStore()
    calls: list[tuple[str, str]] = []
    answers = {"refuse": True}

    def drop(record: WorkerRecord, key: str) -> bool:
        calls.append((record.worker_id, key))
        return not answers["refuse"]

    # w1 holds both adapters (and one no table places) from before placement ran; each adapter it is not
    # assigned is dropped once two tables in a row leave it out
    directory = directory_with(("w0", ()), ("w1", ()))
    directory.heartbeat(
        WorkerRecord(
            "w1", "http://w1", BASE, scheduler=SchedulerStats(device_adapters=(hot, warm, "unplaced"))
        ),
        60,
    )
    first = run_placement(db_session_factory, directory, store, SETTINGS, now=NOW, drop=drop)
    assert calls == []  # no previous table: API servers may still route anywhere
    holders = {k: {w for w, _ in row} for k, row in first.rows.items()}
    run_placement(db_session_factory, directory, store, SETTINGS, now=NOW, drop=drop)
    expected = sorted(("w1", k) for k in (hot, warm) if "w1" not in holders[k])
    assert expected and sorted(calls) == expected and "unplaced" not in {k for _, k in calls}
    calls.clear()
    run_placement(db_session_factory, directory, store, SETTINGS, now=NOW, drop=drop)
    assert sorted(calls) == expected  # refused (in use): asked again on the next run
