"""Placement by hand with a fake judge: a GPU takes adapters while their rates sum to at most 1.0."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from twin.planner.placement import (
    PlacementError,
    ffd_order,
    place_ffd,
    place_max_base,
    place_random,
    spread_latency,
)
from twin.planner.workload import PlannedAdapter


def _rank(a: PlannedAdapter) -> int:
    return a.rank


class RateJudge:
    """Accepts a GPU whose rates sum to <= limit (returns the sum); records the sizes it was asked about."""

    def __init__(self, limit: float = 1.0) -> None:
        self.limit = limit
        self.asked: list[int] = []

    def __call__(self, adapters: Sequence[PlannedAdapter]) -> float | None:
        self.asked.append(len(adapters))
        total = sum(a.rate for a in adapters)
        return total if total <= self.limit + 1e-9 else None


def test_ffd_orders_by_size_then_zig_zags_rates() -> None:
    adapters = [
        PlannedAdapter("s1", 8, 0.1),
        PlannedAdapter("b1", 16, 0.4),
        PlannedAdapter("s2", 8, 0.3),
        PlannedAdapter("b2", 16, 0.2),
        PlannedAdapter("b3", 16, 0.3),
        PlannedAdapter("s3", 8, 0.2),
    ]
    assert [a.adapter_id for a in ffd_order(adapters, _rank)] == ["b1", "b2", "b3", "s2", "s1", "s3"]


def test_a_refused_test_point_rolls_back_and_retries_one_at_a_time() -> None:
    adapters = [PlannedAdapter(f"a{i}", 8, 0.3) for i in range(10)]
    judge = RateJudge()
    gpus = place_ffd(adapters, judge, _rank)
    assert [len(g.adapters) for g in gpus] == [3, 3, 3, 1]  # 0.9 each, then the last 0.3
    assert [g.choice for g in gpus] == pytest.approx([0.9, 0.9, 0.9, 0.3])
    # each adapter alone first (none needs splitting); then the first GPU: test points 1, 2, 4 (refused),
    # back to 2 and one at a time: 3 (accepted), 4 (refused)
    assert judge.asked[:15] == [1] * 10 + [1, 2, 4, 3, 4]
    assert sorted(a.adapter_id for g in gpus for a in g.adapters) == sorted(a.adapter_id for a in adapters)


def test_a_hot_adapter_is_split_into_shares_on_different_gpus() -> None:
    gpus = place_ffd([PlannedAdapter("hot", 8, 1.2), PlannedAdapter("b", 8, 0.3)], RateJudge(), _rank)
    holders = [g for g in gpus if any(a.adapter_id == "hot" for a in g.adapters)]
    assert len(holders) == 2 and all(sum(a.adapter_id == "hot" for a in g.adapters) == 1 for g in holders)
    assert sum(a.rate for g in gpus for a in g.adapters if a.adapter_id == "hot") == pytest.approx(1.2)


def test_an_adapter_no_gpu_takes_at_any_split_is_an_error() -> None:
    with pytest.raises(PlacementError, match="fits no GPU"):
        place_ffd([PlannedAdapter("x", 8, 1.0)], RateJudge(limit=0.0), _rank)


def test_the_latency_variant_spreads_rates_over_the_same_gpus() -> None:
    adapters = [
        PlannedAdapter("a", 8, 0.5),
        PlannedAdapter("b", 8, 0.4),
        PlannedAdapter("c", 8, 0.3),
        PlannedAdapter("d", 8, 0.2),
    ]
    spread = spread_latency(adapters, 2, RateJudge())
    assert spread is not None
    assert sorted(sorted(a.adapter_id for a in g.adapters) for g in spread) == [["a", "d"], ["b", "c"]]
    assert spread_latency(adapters, 1, RateJudge()) is None  # 1.4 on one GPU: refused


def test_max_base_packs_by_memory_alone_and_random_places_everything() -> None:
    adapters = [PlannedAdapter(f"a{i}", 8, 5.0) for i in range(5)]
    packed = place_max_base(adapters, lambda members: sum(a.rank for a in members) <= 16, _rank)
    assert [len(g) for g in packed] == [2, 2, 1]  # load ignored: 10 req/s on a GPU
    shuffled = place_random(adapters, 3, seed=7)
    assert shuffled == place_random(adapters, 3, seed=7) and len(shuffled) <= 3
    assert sorted(a.adapter_id for g in shuffled for a in g) == [a.adapter_id for a in adapters]
