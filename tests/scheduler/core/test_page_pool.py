"""Page pool (KV view) invariants under random allocate/free/append (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.page_pool import PagePool, num_pages_for_adapter


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
    st.tuples(st.sampled_from(["alloc", "free", "append"]), st.integers(0, 6), st.integers(0, 40)),
    max_size=60,
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


def test_static_split_keeps_adapter_and_kv_pages_apart() -> None:
    pool = PagePool(num_pages=6, block_size=4, max_kv_pages=4)
    first = pool.reserve(2)
    assert first is not None and all(p >= 4 for p in first) and pool.num_free_blocks == 4
    assert pool.reserve(1) is None  # the adapter share is used up; KV pages are never borrowed
    assert pool.allocate(4) is not None and pool.allocate(1) is None


def test_unified_pool_gives_adapters_a_contiguous_run_from_the_top_and_kv_the_lowest_ids() -> None:
    pool = PagePool(num_pages=10, block_size=4)
    assert pool.is_unified
    run = pool.reserve(3)
    assert run == [7, 8, 9]
    assert pool.allocate(2) == [0, 1]
    assert pool.num_free_blocks == 5 and pool.num_free_pages == 5
    pool.release(run)
    assert pool.allocate(1) == [2]  # still the lowest free id


def test_unified_reserve_needs_a_run_not_just_free_pages() -> None:
    pool = PagePool(num_pages=6, block_size=1)
    kv = pool.allocate(6)
    assert kv is not None
    pool.free([kv[1], kv[3], kv[5]])  # 3 free pages, no 2 of them adjacent
    assert pool.num_free_pages == 3 and not pool.can_reserve(2) and pool.reserve(2) is None
    assert pool.can_reserve(1) and pool.reserve(1) == [5]


def test_can_reserve_counts_pages_an_eviction_would_free() -> None:
    pool = PagePool(num_pages=6, block_size=1)
    a = pool.reserve(2)
    b = pool.reserve(2)
    assert a == [4, 5] and b == [2, 3]
    assert pool.allocate(2) == [0, 1]
    assert not pool.can_reserve(3)
    assert pool.can_reserve(3, also_free=a) is False  # [4, 5] alone is a run of 2
    assert pool.can_reserve(4, also_free=a + b)


def test_kv_pages_cannot_be_released_as_adapter_pages() -> None:
    pool = PagePool(num_pages=4, block_size=4)
    kv = pool.allocate(2)
    assert kv is not None
    with pytest.raises(ValueError):
        pool.release(kv)
    assert pool.num_kv_pages == 2 and pool.num_adapter_pages == 0  # a refused call changes nothing


@pytest.mark.parametrize(
    ("rank", "num_bytes", "page_bytes", "expected"),
    [(8, 800, 400, 2), (8, 800, 100, 8), (8, 800, 99, 16), (16, 0, 100, 0), (3, 300, 250, 2)],
)
def test_adapter_pages_are_cut_along_the_rank_dimension(
    rank: int, num_bytes: int, page_bytes: int, expected: int
) -> None:
    assert num_pages_for_adapter(rank, num_bytes, page_bytes) == expected


pool_ops = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "free", "reserve", "release", "append"]),
        st.integers(0, 7),
        st.integers(0, 40),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(num_kv=st.integers(1, 12), num_extra=st.integers(0, 8), block_size=st.integers(1, 8), ops=pool_ops)
def test_kv_and_adapter_pages_share_one_budget_exactly(
    num_kv: int, num_extra: int, block_size: int, ops: list
) -> None:
    """Both layouts (num_extra 0: unified): never over budget; free + used == total; KV and adapter pages
    counted exactly; release returns exactly what was reserved; KV pages always address the KV tensor;
    unified adapter reservations are contiguous runs."""
    pool = PagePool(num_kv + num_extra, block_size, max_kv_pages=num_kv)
    kv_tables: list[list[int]] = []
    reservations: list[list[int]] = []
    for op, n, tokens in ops:
        if op == "alloc":
            free_before = pool.num_free_blocks
            ids = pool.allocate(n)
            assert (ids is None) == (n > free_before)
            if ids is not None:
                kv_tables.append(ids)
        elif op == "reserve":
            is_possible = pool.can_reserve(n)
            ids = pool.reserve(n)
            assert (ids is None) == (not is_possible)
            if n > pool.num_free_adapter_pages + (len(ids) if ids else 0):
                assert ids is None
            if ids is not None:
                assert len(ids) == n
                if pool.is_unified:
                    assert ids == list(range(ids[0], ids[0] + n)) if n else ids == []
                else:
                    assert all(p >= num_kv for p in ids)
                reservations.append(ids)
        elif op == "free" and kv_tables:
            pool.free(kv_tables.pop(n % len(kv_tables)))
        elif op == "release" and reservations:
            ids = reservations.pop(n % len(reservations))
            free_before = pool.num_free_pages
            pool.release(ids)
            assert pool.num_free_pages == free_before + len(ids)
        elif op == "append" and kv_tables:
            table = kv_tables[n % len(kv_tables)]
            before = list(table)
            if pool.append_slots(table, tokens) is None:
                assert table == before
        kv_held = [p for t in kv_tables for p in t]
        adapter_held = [p for r in reservations for p in r]
        held = kv_held + adapter_held
        assert len(held) == len(set(held)) and all(0 <= p < pool.num_pages for p in held)
        assert all(p < num_kv for p in kv_held)
        assert pool.num_kv_pages == len(kv_held) and pool.num_adapter_pages == len(adapter_held)
        assert pool.owner_counts() == (pool.num_free_pages, len(kv_held), len(adapter_held))
        assert pool.num_used_pages + pool.num_free_pages == pool.num_pages
    for table in kv_tables:
        pool.free(table)
    for ids in reservations:
        pool.release(ids)
    assert pool.num_free_pages == pool.num_pages and pool.num_free_blocks == num_kv
