"""Baseline placements (random, contiguous): one holder each, stable, only live workers; chosen by setting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.placement.placement import AdapterDemand, PlacementConfig, default_operating_points
from scheduler.placement.placement_baselines import PLACEMENT_POLICIES, contiguous_placement, random_placement

CONFIG = PlacementConfig(default_operating_points(1000.0))


def _adapters(num: int) -> list[AdapterDemand]:
    return [AdapterDemand(f"a{i:02d}", 8 << (i % 5), float(i % 3)) for i in range(num)]


def test_contiguous_cuts_sorted_keys_into_equal_runs() -> None:
    placement = contiguous_placement(_adapters(6), ["w2", "w1", "w3"], {}, CONFIG)
    holders = [placement.table[f"a{i:02d}"][0][0] for i in range(6)]
    assert holders == ["w1", "w1", "w2", "w2", "w3", "w3"]
    assert [w.num_adapters for w in placement.workers] == [2, 2, 2]


def test_random_is_stable_and_moves_only_what_a_new_worker_takes() -> None:
    first = random_placement(_adapters(20), ["w1", "w2"], {}, CONFIG)
    assert random_placement(_adapters(20), ["w2", "w1"], first.table, CONFIG).table == first.table
    again = random_placement(_adapters(20), ["w1", "w2"], first.table, CONFIG)
    assert again.moved == () and again.dropped == {}
    assert len({row[0][0] for row in first.table.values()}) == 2  # 20 adapters spread over both


@given(
    num_adapters=st.integers(0, 30),
    workers=st.sets(st.sampled_from([f"w{i}" for i in range(6)]), max_size=6),
    policy=st.sampled_from(["random", "contiguous"]),
)
def test_every_adapter_has_exactly_one_live_holder(num_adapters: int, workers: set[str], policy: str) -> None:
    placement = PLACEMENT_POLICIES[policy](_adapters(num_adapters), sorted(workers), {}, CONFIG)
    if not workers:
        assert placement.table == {}
        return
    assert set(placement.table) == {a.adapter_key for a in _adapters(num_adapters)}
    for row in placement.table.values():
        assert len(row) == 1 and row[0][0] in workers and row[0][1] == 1.0
    assert sum(w.num_adapters for w in placement.workers) == num_adapters


def test_the_placement_policy_setting_is_validated(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from settings import Settings

    assert Settings(data_dir=tmp_path, placement_policy="contiguous").placement.policy == "contiguous"
    with pytest.raises(
        ValueError,
        match="placement policy 'sticky'; choose one of contiguous, demand_only, loraserve, random, replicated",
    ):
        Settings(data_dir=tmp_path, placement_policy="sticky")
