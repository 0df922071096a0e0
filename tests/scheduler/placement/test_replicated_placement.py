"""Demand-replicated placement: holders follow demand, memory per worker holds, hysteresis, fixed point."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.membership import WorkerRecord
from cluster.placement_table import UsageHistory, VersionInfo, build_table
from scheduler.placement.placement import (
    AdapterDemand,
    Placement,
    PlacementConfig,
    compute_placement,
    default_operating_points,
)
from scheduler.placement.placement_baselines import PLACEMENT_POLICIES
from scheduler.placement.replicated_placement import compute_replicated_placement, holder_count
from settings import Settings

OPS = default_operating_points(1000.0)
CONFIG = PlacementConfig(OPS)
RANKS = (8, 16, 32, 64, 128)
WORKERS = ["w0", "w1", "w2", "w3"]

adapter_lists = st.lists(
    st.tuples(st.sampled_from(RANKS), st.one_of(st.just(0.0), st.floats(0.01, 5000.0))), max_size=30
).map(lambda xs: [AdapterDemand(f"a{i}", r, d) for i, (r, d) in enumerate(xs)])
worker_lists = st.lists(st.sampled_from([f"w{i}" for i in range(8)]), min_size=1, max_size=8, unique=True)


def zipf_demand(num: int, hot_share: float | None = None) -> list[AdapterDemand]:
    """`num` adapters of cycling ranks with Zipf(1) demand; the first takes `hot_share` when given."""
    weights = [1 / (i + 1) for i in range(num)]
    if hot_share is not None:
        rest = sum(weights[1:])
        weights = [hot_share * rest / (1 - hot_share), *weights[1:]]
    return [AdapterDemand(f"a{i:02d}", RANKS[i % len(RANKS)], 1000 * w) for i, w in enumerate(weights)]


def rank_sums(placement: Placement, adapters: list[AdapterDemand]) -> dict[str, int]:
    rank = {a.adapter_key: a.rank for a in adapters}
    sums: dict[str, int] = {}
    for key, row in placement.table.items():
        for worker, _ in row:
            sums[worker] = sums.get(worker, 0) + rank.get(key, 0)
    return sums


@settings(max_examples=150, deadline=None)
@given(adapter_lists, worker_lists, st.one_of(st.none(), st.integers(8, 600)), st.floats(0.5, 4.0))
def test_holders_stay_within_workers_and_memory_and_cover_demand_when_memory_allows(
    adapters: list[AdapterDemand], workers: list[str], max_rank_sum: int | None, headroom: float
) -> None:
    config = PlacementConfig(OPS, replication_headroom=headroom, max_worker_rank_sum=max_rank_sum)
    placement = compute_replicated_placement(adapters, workers, {}, config)
    for key, row in placement.table.items():
        holders = [w for w, _ in row]
        assert 1 <= len(holders) <= len(workers) and len(set(holders)) == len(holders), key
        assert set(holders) <= set(workers)
        assert abs(sum(w for _, w in row) - 1.0) < 1e-9
    if max_rank_sum is not None:
        assert max(rank_sums(placement, adapters).values(), default=0) <= max_rank_sum
    # coverage is guaranteed when any fill leaves room: N x (budget - largest rank) >= every rank once
    total = sum(a.rank for a in adapters)
    if max_rank_sum is None or len(workers) * (max_rank_sum - max(RANKS)) >= total:
        assert {a.adapter_key for a in adapters if a.demand_tokens_per_s > 0} <= set(placement.table)


def test_the_hot_adapter_gets_holders_in_proportion_to_its_demand() -> None:
    adapters = zipf_demand(60, hot_share=0.2)
    replicated = PLACEMENT_POLICIES["replicated"](adapters, WORKERS, {}, CONFIG)
    # 0.2 of the demand x 4 workers x headroom 1.5 = 1.2 holders' worth (its load share is less: rank 8)
    assert len(replicated.table["a00"]) >= 2
    # LoRAServe's packing keeps an adapter that fits one worker's share on one worker
    assert len(compute_placement(adapters, WORKERS, {}, CONFIG).table["a00"]) == 1


def test_an_adapter_needing_every_worker_gets_every_worker() -> None:
    adapters = [AdapterDemand("hot", 8, 10_000.0), AdapterDemand("cold", 8, 10.0)]
    placement = compute_replicated_placement(adapters, WORKERS, {}, CONFIG)
    assert {w for w, _ in placement.table["hot"]} == set(WORKERS)
    assert len(placement.table["cold"]) == 1


def test_unchanged_demand_and_workers_reproduce_the_table() -> None:
    adapters = zipf_demand(40)
    first = compute_replicated_placement(adapters, WORKERS, {}, CONFIG)
    again = compute_replicated_placement(adapters, WORKERS, first.table, CONFIG)
    assert again.table == first.table and again.moved == () and again.dropped == {}


def test_holder_count_follows_need_with_hysteresis() -> None:
    assert holder_count(2.1, 0, 8, 0.25) == 3
    assert holder_count(1.9, 2, 8, 0.25) == 2
    assert holder_count(0.8, 2, 8, 0.25) == 2  # within the hysteresis below one holder fewer
    assert holder_count(0.7, 2, 8, 0.25) == 1
    assert holder_count(0.01, 0, 8, 0.25) == 1
    assert holder_count(9.5, 0, 4, 0.25) == 4


def test_a_small_demand_shift_keeps_the_replicas() -> None:
    adapters = zipf_demand(20)
    first = compute_replicated_placement(adapters, WORKERS, {}, CONFIG)
    multi = [k for k, row in first.table.items() if len(row) > 1]
    assert multi
    shifted = [
        AdapterDemand(a.adapter_key, a.rank, a.demand_tokens_per_s * (0.9 if a.adapter_key in multi else 1.0))
        for a in adapters
    ]
    again = compute_replicated_placement(shifted, WORKERS, first.table, CONFIG)
    assert all(len(again.table[k]) == len(first.table[k]) for k in multi)


def test_memory_goes_to_one_copy_of_every_adapter_before_replicas() -> None:
    adapters = [AdapterDemand("hot", 64, 5000.0), *(AdapterDemand(f"c{i}", 64, 10.0) for i in range(7))]
    placement = compute_replicated_placement(
        adapters, ["w0", "w1"], {}, PlacementConfig(OPS, max_worker_rank_sum=256)
    )
    assert set(placement.table) == {a.adapter_key for a in adapters}
    assert max(rank_sums(placement, adapters).values()) <= 256
    assert len(placement.table["hot"]) == 1  # 8 x 64 fill 2 x 256: no room for a second copy of "hot"


def test_zero_demand_adapters_keep_one_holder_where_memory_allows() -> None:
    adapters = [AdapterDemand("busy", 8, 100.0), AdapterDemand("idle", 128, 0.0)]
    placement = compute_replicated_placement(
        adapters, WORKERS, {"idle": (("w2", 1.0),)}, PlacementConfig(OPS, max_worker_rank_sum=136)
    )
    assert placement.table["idle"] == (("w2", 1.0),)
    tight = compute_replicated_placement(adapters, ["w0"], {}, PlacementConfig(OPS, max_worker_rank_sum=100))
    assert "idle" not in tight.table  # no worker has memory for it: routed to any worker


def test_the_placement_job_builds_the_replicated_table_from_settings() -> None:
    settings_ = Settings(
        placement_policy="replicated", placement_replication_headroom=4.0, placement_bucket_s=10.0
    )
    history = UsageHistory({"hot": [5000.0], "cold": [100.0]}, {}, {"hot": 0.0, "cold": 0.0}, {})
    versions = {
        "hot": VersionInfo(settings_.base_model_name, 8),
        "cold": VersionInfo(settings_.base_model_name, 8),
    }
    records = [WorkerRecord(w, f"http://{w}", settings_.base_model_name) for w in WORKERS]
    table = build_table(history, versions, records, None, settings_, datetime.now(UTC))
    assert len(table.rows["hot"]) == 4 and len(table.rows["cold"]) == 1


def test_placement_demand_only_publishes_demand_but_no_rows() -> None:
    settings_ = Settings(placement_policy="demand_only", placement_bucket_s=10.0)
    history = UsageHistory({"hot": [5000.0]}, {}, {"hot": 0.0}, {})
    versions = {"hot": VersionInfo(settings_.base_model_name, 8)}
    records = [WorkerRecord(w, f"http://{w}", settings_.base_model_name) for w in WORKERS]
    table = build_table(history, versions, records, None, settings_, datetime.now(UTC))
    assert table.rows == {} and table.demand[0].demand_by_rank[8] > 0
