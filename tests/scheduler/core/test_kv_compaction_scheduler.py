"""The batch scheduler admits a cold adapter's request into a fragmented unified pool by moving KV pages out of
the adapter's run (PagePool.reserve_moving): block tables, the prefix cache and the step plan follow."""

from __future__ import annotations

from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from scheduler.core.prefix_cache import PrefixCache
from tests.scheduler.core.scheduler_helpers import BLOCK_SIZE, PAGE_BYTES, ManualClock, carry_out, make_seq


def _fragmented_scheduler(max_compaction_pages: int, with_cache: bool = False) -> BatchScheduler:
    """8 pages, base-model requests r0, r2, r4, r6 running on pages 0, 2, 4, 6; pages 1, 3, 5, 7 free."""
    pool = PagePool(8, BLOCK_SIZE)
    clock = ManualClock()
    residency = AdapterResidency(pool, PAGE_BYTES, clock=clock, max_compaction_pages=max_compaction_pages)
    cache = PrefixCache(pool) if with_cache else None
    scheduler = BatchScheduler(pool, residency, FifoPolicy(), 8, 64, prefix_cache=cache, clock=clock)
    for i in range(8):
        # distinct prompts of one block and one slot more: one page each, room for the first output token
        scheduler.add(make_seq(f"r{i}", BLOCK_SIZE - 1, 3, None, float(i)))
        scheduler.waiting[f"r{i}"].token_ids[0] = 100 + i
    carry_out(scheduler, scheduler.schedule())
    for i in (1, 3, 5, 7):
        seq = scheduler.get(f"r{i}")
        assert seq is not None
        scheduler.finish(seq, "abort")
    assert [s.block_table for s in scheduler.running] == [[0], [2], [4], [6]]
    residency.register("cold", "/host/cold", rank=2, num_bytes=2 * PAGE_BYTES)
    scheduler.add(make_seq("c", BLOCK_SIZE - 1, 2, "cold", 9.0))
    return scheduler


def test_fragmented_pool_admits_the_cold_request_by_moving_one_kv_page() -> None:
    scheduler = _fragmented_scheduler(max_compaction_pages=4)
    plan = scheduler.schedule()
    state = scheduler.residency.get("cold")
    assert state is not None and state.residency is Residency.PREPARING and state.page_ids == [6, 7]
    assert plan.kv_block_moves == [(6, 1)] and [load.adapter_id for load in plan.adapter_loads] == ["cold"]
    assert [s.block_table for s in scheduler.running[:4]] == [[0], [2], [4], [1]]  # r6 follows its page
    held = [p for s in scheduler.running for p in s.block_table]
    assert len(held) == len(set(held)) and not set(held) & {6, 7}
    assert scheduler.pool.owner_counts() == (
        scheduler.pool.num_free_pages,
        len(held),
        2,
    )


def test_without_compaction_the_cold_request_waits_for_a_run() -> None:
    scheduler = _fragmented_scheduler(max_compaction_pages=0)
    plan = scheduler.schedule()
    assert not plan.adapter_loads and not plan.kv_block_moves and "c" in scheduler.waiting


def test_cached_prefix_blocks_move_with_their_pages_and_are_evicted_there() -> None:
    pool = PagePool(8, BLOCK_SIZE)
    cache = PrefixCache(pool)
    pages = pool.allocate(2)
    assert pages == [0, 1]
    tokens = list(range(2 * BLOCK_SIZE + 1))
    assert cache.insert(None, tokens, pages, 0, 2, namespace=None) == 2
    cache.release(pages)  # the sequence that computed them finished
    moved = pool.allocate(1)
    assert moved == [2]
    pool.free([1])  # what PagePool.reserve_moving does for a move 1 -> 2
    cache.move_pages([(1, 2)])
    block = cache.block(2)
    assert block is not None and block.page == 2 and cache.block(1) is None
    assert cache.match(None, tokens, namespace=None) == [0, 2]
    assert cache.evict_leaves(1) == 1 and cache.block(2) is None and pool.owner_counts() == (7, 1, 0)
