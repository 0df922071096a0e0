"""The host tier's bookkeeping: byte budget, LRU order, hits and misses (no torch)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.host_tier import HostTier


def test_least_recently_used_entries_make_room_and_lookups_refresh_them() -> None:
    tier = HostTier(max_bytes=100)
    assert tier.add("a", 40) == [] and tier.add("b", 40) == []
    assert tier.lookup("a")  # "b" is now the least recently used
    assert tier.add("c", 40) == ["b"]
    assert tier.keys() == ["a", "c"] and tier.num_bytes == 80
    assert not tier.lookup("b") and (tier.num_hits, tier.num_misses) == (1, 1)


def test_an_entry_larger_than_the_budget_is_not_kept_and_evicts_nothing() -> None:
    tier = HostTier(max_bytes=100)
    tier.add("a", 60)
    assert tier.add("huge", 101) is None
    assert tier.keys() == ["a"] and tier.num_bytes == 60


def test_re_adding_a_key_replaces_its_size() -> None:
    tier = HostTier(max_bytes=100)
    tier.add("a", 60)
    assert tier.add("a", 30) == [] and tier.num_bytes == 30 and len(tier) == 1


@settings(max_examples=200, deadline=None)
@given(
    max_bytes=st.integers(0, 200),
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "lookup", "remove"]), st.integers(0, 6), st.integers(0, 120))
    ),
)
def test_the_budget_is_never_exceeded_and_bytes_are_counted_exactly(max_bytes: int, ops: list) -> None:
    tier = HostTier(max_bytes)
    sizes: dict[str, int] = {}
    for op, n, size in ops:
        key = f"k{n}"
        if op == "add":
            victims = tier.add(key, size)
            if victims is None:
                assert size > max_bytes
            else:
                sizes.pop(key, None)
                for victim in victims:
                    sizes.pop(victim)
                sizes[key] = size
        elif op == "lookup":
            assert tier.lookup(key) == (key in sizes)
        else:
            tier.remove(key)
            sizes.pop(key, None)
        assert tier.num_bytes == sum(sizes.values()) <= max_bytes
        assert set(tier.keys()) == set(sizes)
