"""LoRAServe placement: invariants under random demand and workers (hypothesis), and hand-made cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.placement.placement import (
    AdapterDemand,
    Placement,
    PlacementConfig,
    apportion,
    compute_placement,
    default_operating_points,
    rank_bucket,
)

CONFIG = PlacementConfig(default_operating_points(1000.0))
RANKS = (4, 8, 16, 32, 64, 128)

adapter_lists = st.lists(
    st.tuples(st.sampled_from(RANKS), st.one_of(st.just(0.0), st.floats(0.01, 5000.0))), max_size=25
).map(lambda xs: [AdapterDemand(f"a{i}", r, d) for i, (r, d) in enumerate(xs)])
worker_lists = st.lists(st.sampled_from([f"w{i}" for i in range(8)]), min_size=1, max_size=8, unique=True)


def check_invariants(
    placement: Placement, adapters: list[AdapterDemand], workers: list[str], previous: dict
) -> None:
    expected = {a.adapter_key for a in adapters} | set(previous)
    assert set(placement.table) == expected  # every adapter with demand or previously placed has a row
    for key, row in placement.table.items():
        assert row, key
        assert abs(sum(w for _, w in row) - 1.0) < 1e-9
        assert all(0 < w <= 1 + 1e-12 for _, w in row)
        assert {w for w, _ in row} <= set(workers)
        assert len({w for w, _ in row}) == len(row)
    idle = {a.adapter_key for a in adapters if a.demand_tokens_per_s <= 0} | (
        set(previous) - {a.adapter_key for a in adapters}
    )
    for key in idle:
        assert len(placement.table[key]) == 1


def mixing(placement: Placement, adapters: list[AdapterDemand]) -> int:
    """Sum over workers of (rank buckets of its loaded adapters - 1)."""
    buckets = {
        a.adapter_key: rank_bucket(a.rank, list(CONFIG.operating_points))
        for a in adapters
        if a.demand_tokens_per_s > 0
    }
    per_worker: dict[str, set[int]] = {}
    for key, row in placement.table.items():
        if key in buckets:
            for worker, _ in row:
                per_worker.setdefault(worker, set()).add(buckets[key])
    return sum(len(b) - 1 for b in per_worker.values())


@settings(max_examples=150, deadline=None)
@given(adapter_lists, worker_lists)
def test_weights_sum_to_one_every_adapter_held_only_live_workers(adapters, workers):
    placement = compute_placement(adapters, workers, {}, CONFIG)
    check_invariants(placement, adapters, workers, {})


@settings(max_examples=150, deadline=None)
@given(adapter_lists, worker_lists)
def test_unchanged_demand_and_workers_is_a_fixed_point(adapters, workers):
    first = compute_placement(adapters, workers, {}, CONFIG)
    second = compute_placement(adapters, workers, first.table, CONFIG)
    assert second.table == first.table
    assert second.moved == () and second.dropped == {}


@settings(max_examples=150, deadline=None)
@given(adapter_lists, worker_lists, adapter_lists, worker_lists)
def test_invariants_hold_after_demand_and_membership_change(adapters, workers, new_adapters, new_workers):
    previous = compute_placement(adapters, workers, {}, CONFIG).table
    placement = compute_placement(new_adapters, new_workers, previous, CONFIG)
    check_invariants(placement, new_adapters, new_workers, previous)
    for worker, keys in placement.dropped.items():
        for key in keys:
            assert worker not in {w for w, _ in placement.table[key]}
            assert placement.table[key]  # a dropped copy always has another holder


@settings(max_examples=150, deadline=None)
@given(adapter_lists, worker_lists)
def test_rank_buckets_mix_on_few_workers(adapters, workers):
    placement = compute_placement(adapters, workers, {}, CONFIG)
    num_buckets = len(
        {rank_bucket(a.rank, list(CONFIG.operating_points)) for a in adapters if a.demand_tokens_per_s > 0}
    )
    assert mixing(placement, adapters) <= max(0, 2 * num_buckets - 1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.01, 5000.0), min_size=1, max_size=20), worker_lists, st.sampled_from(RANKS))
def test_one_rank_bucket_never_mixes_and_without_min_phi_loads_are_equal(demands, workers, rank):
    adapters = [AdapterDemand(f"a{i}", rank, d) for i, d in enumerate(demands)]
    placement = compute_placement(adapters, workers, {}, CONFIG)
    assert mixing(placement, adapters) == 0
    exact = compute_placement(adapters, workers, {}, PlacementConfig(CONFIG.operating_points, min_phi=0.0))
    loads = [w.load for w in exact.workers]
    assert max(loads) - min(loads) <= 1e-9 * max(1.0, max(loads))
    assert all(abs(load - exact.target_load) <= 1e-9 * max(1.0, load) for load in loads)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=6), st.integers(1, 20))
def test_apportion_sums_to_the_number_of_workers(units, num_bins):
    counts = apportion({8 * (i + 1): float(u) for i, u in enumerate(units)}, num_bins)
    assert sum(counts.values()) == (num_bins if sum(units) > 0 else 0)


def test_low_rank_leftover_goes_where_it_raises_no_padding():
    # 2 workers: rank-128 demand fills one worker and a half; the rank-8 adapter is too small for its own
    # worker (B_8 = 0), so it is a leftover and must land on the worker whose max rank is already 128.
    op = CONFIG.operating_points
    adapters = [AdapterDemand("big", 128, 1.9 * op[128]), AdapterDemand("small", 8, 0.05 * op[8])]
    placement = compute_placement(adapters, ["w0", "w1"], {}, CONFIG)
    assert {w.max_rank for w in placement.workers} == {128}


def test_hot_adapter_is_split_and_cold_ones_keep_one_holder():
    op = CONFIG.operating_points
    adapters = [AdapterDemand("hot", 8, 2.5 * op[8]), AdapterDemand("idle", 8, 0.0)]
    placement = compute_placement(adapters, ["w0", "w1", "w2"], {}, CONFIG)
    assert len(placement.table["hot"]) == 3
    assert [w for w, _ in placement.table["hot"]] == ["w0", "w1", "w2"]
    assert len(placement.table["idle"]) == 1
    assert not placement.is_overloaded


def test_overload_is_flagged_and_still_placed():
    op = CONFIG.operating_points
    placement = compute_placement([AdapterDemand("a", 8, 3 * op[8])], ["w0", "w1"], {}, CONFIG)
    assert placement.is_overloaded
    assert abs(sum(w for _, w in placement.table["a"]) - 1) < 1e-9


def test_new_worker_takes_load_with_few_moves_and_reports_drops():
    op = CONFIG.operating_points
    adapters = [AdapterDemand(f"a{i}", 16, 0.5 * op[16]) for i in range(6)]
    before = compute_placement(adapters, ["w0", "w1", "w2"], {}, CONFIG)
    after = compute_placement(adapters, ["w0", "w1", "w2", "w3"], before.table, CONFIG)
    assert any(key for key, row in after.table.items() if "w3" in {w for w, _ in row})
    assert len(after.moved) <= 4
    kept = sum(
        1 for key, row in after.table.items() for w, _ in row if w in {x for x, _ in before.table[key]}
    )
    assert kept >= len(adapters) - 1


def test_idle_adapter_stays_on_its_previous_holder():
    previous = {"idle": (("w1", 0.3), ("w2", 0.7))}
    placement = compute_placement([AdapterDemand("idle", 8, 0.0)], ["w0", "w1", "w2"], previous, CONFIG)
    assert placement.table["idle"] == (("w2", 1.0),)
    assert placement.dropped == {"w1": ("idle",)}


def test_previous_adapter_whose_holder_died_gets_a_live_one():
    placement = compute_placement([], ["w0"], {"gone": (("dead", 1.0),)}, CONFIG)
    assert placement.table["gone"] == (("w0", 1.0),)


def test_no_worker_means_an_empty_placement():
    assert compute_placement([AdapterDemand("a", 8, 10.0)], [], {}, CONFIG).table == {}


def test_bad_config_is_refused():
    with pytest.raises(ValueError):
        PlacementConfig({8: 0.0})
    with pytest.raises(ValueError):
        default_operating_points(0.0)
