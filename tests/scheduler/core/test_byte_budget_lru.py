"""The byte-budget LRU shared by the host tier and the worker's host file cache: budget, order, pins."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.byte_budget_lru import ByteBudgetLRU


def test_evicts_least_recently_used_first_and_touch_refreshes() -> None:
    lru = ByteBudgetLRU(max_bytes=100)
    for key in ("a", "b", "c"):
        lru.put(key, 40)
    assert lru.touch("a") and not lru.touch("missing")
    assert lru.evict_over_budget() == ["b"]
    assert lru.keys() == ["c", "a"] and lru.num_bytes == 80


def test_pinned_and_kept_entries_stay_even_over_budget() -> None:
    lru = ByteBudgetLRU(max_bytes=50)
    lru.put("pinned", 40)
    lru.pin("pinned")
    lru.put("new", 40)
    assert lru.evict_over_budget(keep="new") == []
    assert lru.num_bytes == 80  # over budget while only pinned or kept entries are left
    lru.unpin("pinned")
    assert lru.evict_over_budget() == ["pinned"] and lru.keys() == ["new"]


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        ByteBudgetLRU(-1)


_KEYS = st.sampled_from([f"k{i}" for i in range(6)])
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _KEYS, st.integers(0, 80)),
        st.tuples(st.just("touch"), _KEYS, st.none()),
        st.tuples(st.just("remove"), _KEYS, st.none()),
        st.tuples(st.just("pin"), _KEYS, st.none()),
        st.tuples(st.just("unpin"), _KEYS, st.none()),
        st.tuples(st.just("evict"), st.one_of(st.none(), _KEYS), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(max_bytes=st.integers(0, 150), ops=_OPS)
def test_random_operations_keep_budget_order_and_pins(max_bytes: int, ops: list) -> None:
    lru = ByteBudgetLRU(max_bytes)
    order: list[str] = []  # the model: keys, least recently used first
    sizes: dict[str, int] = {}
    pins: dict[str, int] = {}
    for op, key, size in ops:
        if op == "put":
            lru.put(key, size)
            order = [k for k in order if k != key] + [key]
            sizes[key] = size
        elif op == "touch":
            assert lru.touch(key) == (key in sizes)
            if key in sizes:
                order = [k for k in order if k != key] + [key]
        elif op == "remove":
            lru.remove(key)
            order = [k for k in order if k != key]
            sizes.pop(key, None)
        elif op == "pin":
            lru.pin(key)
            pins[key] = pins.get(key, 0) + 1
        elif op == "unpin":
            lru.unpin(key)
            if pins.get(key, 0) > 1:
                pins[key] -= 1
            else:
                pins.pop(key, None)
        else:
            victims = lru.evict_over_budget(keep=key)
            eligible = [k for k in order if k != key and k not in pins]
            assert victims == eligible[: len(victims)]  # least recently used first, never pinned or kept
            order = [k for k in order if k not in victims]
            last_size = sizes[victims[-1]] if victims else 0
            for victim in victims:
                del sizes[victim]
            # the budget holds unless only pinned or kept entries remain
            assert lru.num_bytes <= max_bytes or all(k == key or k in pins for k in order)
            assert not victims or lru.num_bytes + last_size > max_bytes  # no entry evicted beyond need
        assert lru.keys() == order
        assert lru.num_bytes == sum(sizes.values())
        assert all(lru.is_pinned(k) for k in pins)
