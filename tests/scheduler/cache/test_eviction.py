"""Adapter cache eviction policies on hand-made caches: where LRU, Chameleon and FastLibra disagree."""

from __future__ import annotations

import math

import pytest

from scheduler.cache.eviction import (
    EVICTION_POLICIES,
    CacheView,
    ChameleonPolicy,
    EvictionCandidate,
    FastLibraPolicy,
    LruPolicy,
    estimated_load_seconds,
    make_eviction_policy,
)

NOW = 100.0


def candidate(
    adapter_id: str, num_bytes: int, num_accesses: int, last_use: float, load_seconds: float
) -> EvictionCandidate:
    return EvictionCandidate(
        adapter_id, num_bytes, num_bytes // 1000, 8, num_accesses, last_use, load_seconds
    )


# Least recently used first, as the residency hands them over.
BIG_HOT_OLD = candidate("big_hot_old", 8000, 10, last_use=50.0, load_seconds=0.008)  # LRU's victim
FAST_MID = candidate(
    "fast_mid", 2000, 2, last_use=80.0, load_seconds=0.0005
)  # reloads fast: FastLibra's victim
SMALL_RARE_NEW = candidate("small_rare_new", 1000, 1, last_use=95.0, load_seconds=0.001)  # Chameleon's victim
CACHE = [BIG_HOT_OLD, FAST_MID, SMALL_RARE_NEW]
VIEW = CacheView(
    now=NOW, num_device_adapters=3, num_recent_accesses=13, access_shares=(10 / 13, 2 / 13, 1 / 13)
)


def test_lru_evicts_the_least_recently_used_first() -> None:
    assert LruPolicy().order(CACHE, VIEW) == ["big_hot_old", "fast_mid", "small_rare_new"]


def test_chameleon_keeps_the_big_popular_adapter_lru_would_evict_first() -> None:
    # scores: big_hot_old 0.45*1 + 0.10*0 + 0.45*1 = 0.9; fast_mid 0.45*0.2 + 0.10*0.6 + 0.45*0.25 = 0.2625;
    # small_rare_new 0.45*0.1 + 0.10*0.9 + 0.45*0.125 = 0.19125
    scores = ChameleonPolicy().scores(CACHE, VIEW)
    assert scores == pytest.approx({"big_hot_old": 0.9, "fast_mid": 0.2625, "small_rare_new": 0.19125})
    assert ChameleonPolicy().order(CACHE, VIEW) == ["small_rare_new", "fast_mid", "big_hot_old"]


def test_fastlibra_evicts_the_adapter_cheapest_to_bring_back_first() -> None:
    # Eval = cost * prob * (1 - sigmoid(age / 10)):
    # big_hot_old 0.008 * 10/13 * s(5) = 4.1e-5; fast_mid 0.0005 * 2/13 * s(2) = 9.2e-6;
    # small_rare_new 0.001 * 1/13 * s(0.5) = 2.9e-5 (s(x) = 1 / (1 + e^x))
    policy = FastLibraPolicy(tau_s=10.0)
    assert policy.order(CACHE, VIEW) == ["fast_mid", "small_rare_new", "big_hot_old"]
    expected = 0.0005 * (2 / 13) / (1 + math.exp(2.0))
    assert policy.value(FAST_MID, VIEW) == pytest.approx(expected)


def test_fastlibra_prefers_reload_cost_over_popularity_where_chameleon_sees_only_size() -> None:
    # Same bytes and age: a popular adapter whose measured reload is fast vs a rarer slow one.
    popular_fast = candidate("popular_fast", 4000, 8, last_use=90.0, load_seconds=0.001)
    rare_slow = candidate("rare_slow", 4000, 2, last_use=90.0, load_seconds=0.05)
    view = CacheView(now=NOW, num_device_adapters=2, num_recent_accesses=10, access_shares=(0.8, 0.2))
    assert ChameleonPolicy().order([popular_fast, rare_slow], view) == ["rare_slow", "popular_fast"]
    assert FastLibraPolicy().order([popular_fast, rare_slow], view) == ["popular_fast", "rare_slow"]


def test_fastlibra_recency_decay_orders_otherwise_equal_adapters_oldest_first() -> None:
    recent = candidate("recent", 4000, 3, last_use=99.0, load_seconds=0.01)
    old = candidate("old", 4000, 3, last_use=40.0, load_seconds=0.01)
    view = CacheView(now=NOW, num_device_adapters=2, num_recent_accesses=6, access_shares=(0.5, 0.5))
    assert FastLibraPolicy().order([recent, old], view) == ["old", "recent"]


def test_fastlibra_adapter_count_term_is_expected_distinct_adapters_over_resident_ones() -> None:
    # Low_lora = sum_i 1 - (1 - p_i)^BS = 2 * (1 - 0.5^4) = 1.875 for two adapters of share 0.5 and BS 4.
    one_resident = CacheView(
        NOW, num_device_adapters=1, num_recent_accesses=4, access_shares=(0.5, 0.5), recent_batch_size=4.0
    )
    assert FastLibraPolicy.lora_eval(one_resident) == pytest.approx(1.875)
    many_resident = CacheView(
        NOW, num_device_adapters=4, num_recent_accesses=4, access_shares=(0.5, 0.5), recent_batch_size=4.0
    )
    assert FastLibraPolicy.lora_eval(many_resident) == 1.0  # max(1, 1.875 / 4)
    adapter = candidate("a", 4000, 2, last_use=NOW, load_seconds=0.01)
    assert FastLibraPolicy().value(adapter, one_resident) == pytest.approx(1.875 * 0.01 * 0.5 * 0.5)


def test_adapters_without_recent_accesses_tie_at_zero_and_keep_lru_order_under_fastlibra() -> None:
    first = candidate("first", 9000, 0, last_use=10.0, load_seconds=1.0)
    second = candidate("second", 1000, 0, last_use=20.0, load_seconds=0.001)
    view = CacheView(now=NOW, num_device_adapters=2)
    assert FastLibraPolicy().order([first, second], view) == ["first", "second"]
    assert FastLibraPolicy().order([second, first], view) == ["second", "first"]


def test_chameleon_terms_are_normalised_to_unit_range_over_the_candidates() -> None:
    only = candidate("only", 5000, 0, last_use=NOW, load_seconds=0.1)
    # no accesses -> frequency 0; its own max size -> 1; every age 0 -> recency 1
    assert ChameleonPolicy().scores([only], CacheView(now=NOW, num_device_adapters=1)) == {
        "only": pytest.approx(0.10 + 0.45)
    }


@pytest.mark.parametrize("name", sorted(EVICTION_POLICIES))
def test_every_policy_returns_a_permutation_of_the_candidates(name: str) -> None:
    policy = make_eviction_policy(name)
    assert policy.name == name
    assert sorted(policy.order(CACHE, VIEW)) == sorted(c.adapter_id for c in CACHE)
    assert policy.order([], VIEW) == []


def test_an_unknown_policy_names_the_choices() -> None:
    with pytest.raises(ValueError, match="chameleon.*fastlibra.*lru"):
        make_eviction_policy("mru")


def test_reload_cost_estimate_is_bytes_over_link_bandwidth() -> None:
    assert estimated_load_seconds(16_000_000_000) == pytest.approx(1.0)
    assert estimated_load_seconds(1000, link_bytes_per_s=1000.0) == 1.0
