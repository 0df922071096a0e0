"""The analytic memory check on the tiny profile, by hand: KV 32 B per token (2 layers x K,V x 1 head x 4 dims x
2 B), 512 B pages (16 tokens); an adapter row 512 B, so a rank-r adapter takes exactly r pages."""

from __future__ import annotations

from typing import Any

from tests.twin.profile_helpers import tiny_profile_dict
from twin.planner.memory_check import adapter_cache_bytes, cache_bytes_for_slots, check_memory
from twin.planner.workload import PlannedAdapter, Workload, workload_from_dict
from twin.profile import profile_from_dict


def _profile(device_bytes: int) -> Any:
    data = tiny_profile_dict()
    data["memory"] = {"device_bytes": device_bytes}
    return profile_from_dict(data)


# fixed lengths 100 + 50 tokens: 8 minimum sequences x 150 tokens x 32 B = 38,400 B of KV
WORKLOAD: Workload = workload_from_dict(
    {
        "prompt_tokens": {"p50": 100},
        "output_tokens": {"p50": 50},
        "adapters": [{"name": "a", "rank": 64, "rate": 1}],
    }
)


def _adapters(n: int, rank: int = 64) -> list[PlannedAdapter]:
    return [PlannedAdapter(f"a{i}", rank, 1.0) for i in range(n)]


def test_an_adapter_costs_its_own_pages() -> None:
    profile = _profile(1_000_000)
    assert adapter_cache_bytes(profile, PlannedAdapter("x", 64, 1.0)) == 64 * 512
    assert cache_bytes_for_slots(profile, [*_adapters(3, 8), *_adapters(1, 64)], 2) == (64 + 8) * 512


def test_the_check_refuses_an_overfull_gpu_and_takes_one_adapter_less() -> None:
    profile = _profile(1_000_000)
    # 29 x 64 pages x 512 B = 950,272 B + 38,400 B of KV fits 1,000,000; 30 adapters (983,040 B) do not
    fits = check_memory(profile, WORKLOAD, _adapters(29), cache_bytes_for_slots(profile, _adapters(29), 29))
    over = check_memory(profile, WORKLOAD, _adapters(30), cache_bytes_for_slots(profile, _adapters(30), 30))
    assert fits.is_fitting and fits.kv_bytes == 1_000_000 - 950_272 and fits.min_kv_bytes == 38_400
    assert not over.is_fitting and "leaves 16960 B of KV" in over.reason


def test_a_cache_smaller_than_the_largest_adapter_is_refused() -> None:
    check = check_memory(_profile(1_000_000), WORKLOAD, _adapters(2), cache_bytes=64 * 512 - 1)
    assert not check.is_fitting and "cannot hold the largest adapter" in check.reason


def test_fewer_minimum_sequences_leave_room_for_more_adapters() -> None:
    profile = _profile(1_000_000)
    cache = cache_bytes_for_slots(profile, _adapters(30), 30)
    assert check_memory(profile, WORKLOAD, _adapters(30), cache, min_kv_sequences=3).is_fitting  # 14,400 B KV
