"""Compaction of KV pages out of an adapter's run (scheduler/core/page_compaction.py, PagePool.reserve_moving)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.page_compaction import cheapest_window, compose_moves
from scheduler.core.page_pool import PagePool


def _fragmented_pool() -> tuple[PagePool, list[list[int]]]:
    """8 pages, KV on every other page: 4 free pages, no run of 2."""
    pool = PagePool(num_pages=8, block_size=1)
    tables = [pool.allocate(1) or [] for _ in range(8)]
    for table in tables[1::2]:
        pool.free(table)
    return pool, tables[0::2]


def test_fragmented_pool_reserves_a_run_by_moving_the_fewest_kv_pages_from_the_top() -> None:
    pool, _ = _fragmented_pool()
    assert not pool.can_reserve(3) and pool.reserve(3) is None
    assert pool.can_reserve(3, max_moves=1) and not pool.can_reserve(3, max_moves=0)
    reservation = pool.reserve_moving(3, max_moves=1)
    assert reservation is not None
    run, moves = reservation
    assert run == [5, 6, 7] and moves == [
        (6, 1)
    ]  # one KV page in [5, 8); its replacement: the lowest free id
    assert pool.owner_counts() == (1, 4, 3) and pool.num_free_blocks == 1


def test_move_bound_refuses_a_window_that_needs_more_moves() -> None:
    pool, _ = _fragmented_pool()
    assert not pool.can_reserve(4, max_moves=1)  # every window of 4 holds 2 KV pages
    assert pool.reserve_moving(4, max_moves=1) is None and pool.owner_counts() == (4, 4, 0)
    assert pool.reserve_moving(4, max_moves=2) is not None


def test_compaction_needs_enough_free_pages_and_never_crosses_adapter_pages() -> None:
    pool = PagePool(num_pages=6, block_size=1)
    assert pool.reserve(1) == [5]
    assert pool.allocate(2) == [0, 1]
    assert pool.reserve_moving(4, max_moves=4) is None  # 3 free pages
    assert cheapest_window(bytes([1, 1, 0, 2, 0, 0]), 3, 3) == 0  # [3] is an adapter page: only [0, 3)
    assert cheapest_window(bytes([1, 0, 2, 0, 1, 0]), 3, 3) == 3


def test_composed_moves_go_once_from_the_first_page_to_the_last() -> None:
    assert compose_moves([(6, 1)], [(1, 3)]) == [(6, 3)]
    assert compose_moves([(6, 1), (7, 2)], [(4, 0)]) == [(6, 1), (7, 2), (4, 0)]
    assert compose_moves([(6, 1)], [(5, 1)]) == [(5, 1)]  # page 1's moved block was freed, then reused


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "reserve", "release"]), st.integers(0, 9), st.integers(0, 6)),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(num_pages=st.integers(1, 24), ops=ops)
def test_compaction_keeps_the_partition_and_block_tables_whole(num_pages: int, ops: list) -> None:
    """Random allocations, frees, reservations with a move bound and releases: free/KV/adapter pages partition
    the pool; a reserved run is contiguous; moves go from KV pages inside the run to pages free before,
    outside it; renamed block tables keep their length and hold no adapter page."""
    pool = PagePool(num_pages, block_size=1)
    tables: list[list[int]] = []
    runs: list[list[int]] = []
    for op, n, max_moves in ops:
        if op == "alloc":
            ids = pool.allocate(n)
            if ids is not None:
                tables.append(ids)
        elif op == "free" and tables:
            pool.free(tables.pop(n % len(tables)))
        elif op == "release" and runs:
            pool.release(runs.pop(n % len(runs)))
        elif op == "reserve":
            kv_before = {p for t in tables for p in t}
            free_before = set(range(num_pages)) - kv_before - {p for r in runs for p in r}
            is_possible = pool.can_reserve(n, max_moves=max_moves)
            reservation = pool.reserve_moving(n, max_moves)
            assert (reservation is None) == (not is_possible)
            if reservation is None:
                assert not pool.can_reserve(n)  # compaction never refuses what a free run allows
                continue
            run, moves = reservation
            assert run == list(range(run[0], run[0] + n)) if n else run == []
            assert len(moves) <= max_moves
            assert {old for old, _ in moves} == kv_before & set(run)
            assert all(new in free_before and new not in run for _, new in moves)
            assert len({new for _, new in moves}) == len(moves)
            renamed = dict(moves)
            lengths = [len(t) for t in tables]
            tables = [[renamed.get(p, p) for p in t] for t in tables]
            assert [len(t) for t in tables] == lengths
            runs.append(run)
        kv_held = [p for t in tables for p in t]
        adapter_held = [p for r in runs for p in r]
        assert len(set(kv_held + adapter_held)) == len(kv_held) + len(adapter_held)
        assert pool.owner_counts() == (pool.num_free_pages, len(kv_held), len(adapter_held))
        assert pool.num_free_pages + len(kv_held) + len(adapter_held) == num_pages
    for table in tables:
        pool.free(table)
    for run in runs:
        pool.release(run)
    assert pool.num_free_pages == num_pages and pool.allocate(num_pages) == list(range(num_pages))


@settings(max_examples=300, deadline=None)
@given(
    owner=st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=40),
    num_pages=st.integers(1, 12),
    max_moves=st.integers(0, 12),
)
def test_cheapest_window_is_the_highest_adapter_free_window_with_the_fewest_kv_pages(
    owner: list[int], num_pages: int, max_moves: int
) -> None:
    windows = [
        (owner[s : s + num_pages].count(1), -s)
        for s in range(len(owner) - num_pages + 1)
        if 2 not in owner[s : s + num_pages]
    ]
    best = min(windows, default=None)
    expected = None if best is None or best[0] > max_moves else -best[1]
    assert cheapest_window(bytes(owner), num_pages, max_moves) == expected
