"""Page pool (KV view) invariants under random allocate/free/append (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.page_pool import PagePool


def test_allocate_returns_none_when_full_and_takes_nothing() -> None:
    bm = PagePool(num_pages=4, block_size=16)
    assert bm.allocate(3) is not None
    assert bm.allocate(2) is None
    assert bm.num_free_blocks == 1


def test_double_free_raises() -> None:
    bm = PagePool(num_pages=2, block_size=16)
    ids = bm.allocate(1)
    assert ids is not None
    bm.free(ids)
    with pytest.raises(ValueError):
        bm.free(ids)


def test_append_slots_grows_only_at_block_boundaries() -> None:
    bm = PagePool(num_pages=4, block_size=4)
    table: list[int] = []
    assert bm.append_slots(table, 4) is not None and len(table) == 1
    assert bm.append_slots(table, 4) == [] and len(table) == 1
    assert bm.append_slots(table, 5) is not None and len(table) == 2


def test_reserved_pages_are_not_allocatable() -> None:
    bm = PagePool(num_pages=4, block_size=16)
    reserved = bm.reserve(3)
    assert reserved is not None and bm.allocate(2) is None
    bm.release(reserved)
    assert bm.allocate(4) is not None


operations = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "append"]), st.integers(0, 6), st.integers(0, 40)), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(1, 16), block_size=st.integers(1, 8), ops=operations)
def test_pages_are_never_shared_lost_or_overallocated(num_blocks: int, block_size: int, ops: list) -> None:
    bm = PagePool(num_blocks, block_size)
    owners: list[list[int]] = []
    for op, n, tokens in ops:
        if op == "alloc":
            free_before = bm.num_free_blocks
            ids = bm.allocate(n)
            assert (ids is None) == (n > free_before)
            if ids is not None:
                owners.append(ids)
        elif op == "free" and owners:
            bm.free(owners.pop(n % len(owners)))
        elif op == "append" and owners:
            table = owners[n % len(owners)]
            before = list(table)
            new = bm.append_slots(table, tokens)
            if new is None:
                assert table == before  # nothing half-allocated
            else:
                assert len(table) * block_size >= tokens
        held = [b for ids in owners for b in ids]
        assert len(held) == len(set(held))  # no page owned twice
        assert all(0 <= b < num_blocks for b in held)
        assert len(held) + bm.num_free_blocks == num_blocks  # nothing lost
    for ids in owners:
        bm.free(ids)
    assert bm.num_free_blocks == num_blocks
