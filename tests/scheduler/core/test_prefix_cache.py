"""Prefix KV cache (root -> adapter -> blocks): matching, ref counts, leaf eviction, adapter drop.

The stateful test keeps a model of what each page holds (adapter, adapter load epoch, the token prefix up
to the block's end) and checks that every page a lookup returns holds exactly the KV the prompt needs.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduler.core.page_pool import PagePool
from scheduler.core.prefix_cache import PrefixCache

BS = 4


def computed(cache: PrefixCache, adapter: str | None, tokens: list[int]) -> list[int]:
    """Allocate a sequence's pages, 'compute' them and insert its full blocks; returns its block table."""
    table = cache.pool.allocate(cache.pool.num_blocks_for_tokens(len(tokens)))
    assert table is not None
    assert cache.insert(adapter, tokens, table, 0, len(tokens) // BS) == len(tokens) // BS
    return table


def test_lookup_returns_the_longest_full_block_chain_but_never_the_whole_prompt() -> None:
    cache = PrefixCache(PagePool(16, BS))
    table = computed(cache, "a", list(range(12)))  # three full blocks
    assert cache.match("a", list(range(12)) + [99]) == table  # all three, the 13th token is computed
    assert cache.match("a", list(range(12))) == table[:2]  # the last token must be computed
    assert cache.match("a", list(range(9))) == table[:2]
    assert cache.match("a", [0, 1, 2, 3, 4, 5, 6, 0, 8]) == table[:1]  # differs inside block 2
    assert cache.match("a", [7] + list(range(1, 12))) == []


def test_other_adapter_and_base_model_have_their_own_subtrees() -> None:
    cache = PrefixCache(PagePool(16, BS))
    computed(cache, "a@v1", list(range(8)))
    prompt = list(range(8)) + [1]
    assert cache.match("a@v2", prompt) == [] and cache.match(None, prompt) == []
    base = computed(cache, None, list(range(8)))
    assert cache.match(None, prompt) == base
    assert set(cache.adapters()) == {"a@v1", None}


def test_referenced_blocks_are_never_evicted_and_leaves_go_first() -> None:
    pool = PagePool(16, BS)
    cache = PrefixCache(pool)
    table = computed(cache, "a", list(range(12)))
    cache.release(table)  # the sequence finished: three unreferenced blocks
    other = computed(cache, "b", list(range(4)))  # still referenced
    assert cache.num_evictable_blocks == 3
    assert cache.evict_leaves(1) == 1
    assert cache.match("a", list(range(13))) == table[:2]  # the deepest block went, not the root one
    assert cache.evict_leaves(10) == 2
    assert cache.match("b", list(range(5))) == other and cache.num_cached_blocks == 1
    assert pool.num_kv_pages == 1 + (len(table) - 3)  # b's block + a's unused tail page


def test_least_recently_used_leaf_goes_first() -> None:
    cache = PrefixCache(PagePool(16, BS))
    old = computed(cache, "a", [1, 1, 1, 1])
    new = computed(cache, "a", [2, 2, 2, 2])
    cache.release(old)
    cache.release(new)
    cache.acquire(old)
    cache.release(old)  # old is now the most recently used
    cache.evict_leaves(1)
    assert cache.match("a", [1, 1, 1, 1, 0]) == old and cache.match("a", [2, 2, 2, 2, 0]) == []


def test_drop_adapter_frees_all_its_blocks_and_refuses_referenced_ones() -> None:
    pool = PagePool(16, BS)
    cache = PrefixCache(pool)
    table = computed(cache, "a", list(range(8)))
    computed(cache, "a", [5] * 8)
    with pytest.raises(AssertionError, match="left the device"):
        cache.drop_adapter("a")
    cache.release(table)
    cache.release(cache.match("a", [5] * 9))
    assert cache.drop_adapter("a") == 4
    assert cache.num_cached_blocks == 0 and pool.num_kv_pages == 0 and cache.adapters() == []
    assert cache.match("a", list(range(9))) == []


def test_insert_stops_where_another_page_already_holds_the_block() -> None:
    cache = PrefixCache(PagePool(16, BS))
    first = computed(cache, "a", list(range(8)))
    twin = cache.pool.allocate(2)
    assert twin is not None
    assert cache.insert("a", list(range(8)), twin, 0, 2) == 0  # computed concurrently: keeps its own pages
    assert cache.match("a", list(range(9))) == first


ADAPTERS = ["x", "y", None]


class PrefixCacheMachine(RuleBasedStateMachine):
    """Sequences start (lookup + own pages), compute, insert, finish; leaves are evicted, adapters dropped."""

    @initialize(num_pages=st.integers(4, 24))
    def setup(self, num_pages: int) -> None:
        self.pool = PagePool(num_pages, BS)
        self.cache = PrefixCache(self.pool)
        self.live: dict[int, tuple[str | None, list[int], list[int], int]] = {}  # id -> adapter, tokens, table, n
        self.content: dict[int, tuple[str | None, int, tuple[int, ...]]] = {}  # page -> what its KV is
        self.epoch = {a: 0 for a in ADAPTERS}  # bumped when an adapter leaves the device
        self.next_id = 0

    @rule(adapter=st.sampled_from(ADAPTERS), tokens=st.lists(st.integers(0, 1), min_size=1, max_size=14))
    def start(self, adapter: str | None, tokens: list[int]) -> None:
        matched = self.cache.match(adapter, tokens)
        for i, page in enumerate(matched):  # every hit holds this adapter's (current epoch) KV of this prefix
            assert self.content[page] == (adapter, self.epoch[adapter], tuple(tokens[:(i + 1) * BS]))
        assert len(matched) * BS < len(tokens)
        self.cache.acquire(matched)  # before evicting: a referenced block is never evicted
        num_own = self.pool.num_blocks_for_tokens(len(tokens)) - len(matched)
        if num_own > self.pool.num_free_blocks:
            self.cache.evict_leaves(num_own - self.pool.num_free_blocks)
        own = self.pool.allocate(num_own)
        if own is None:
            self.cache.release(matched)
            return
        table = matched + own
        for i in range(len(matched), len(table)):  # compute the rest
            self.content[table[i]] = (adapter, self.epoch[adapter], tuple(tokens[:(i + 1) * BS]))
        num_cached = self.cache.insert(adapter, tokens, table, len(matched), len(tokens) // BS)
        self.live[self.next_id] = (adapter, tokens, table, num_cached)
        self.next_id += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.live)))
        _, _, table, num_cached = self.live.pop(seq_id)
        self.cache.release(table[:num_cached])
        self.pool.free(table[num_cached:])

    @rule(num_blocks=st.integers(0, 8))
    def evict(self, num_blocks: int) -> None:
        leaves = {b.page for b in self.cache.blocks() if b.ref_count == 0 and b.is_leaf}
        before = {b.page for b in self.cache.blocks()}
        num_freed = self.cache.evict_leaves(num_blocks)
        gone = before - {b.page for b in self.cache.blocks()}
        assert len(gone) == num_freed <= num_blocks
        assert num_freed == min(num_blocks, self.cache.num_evictable_blocks + num_freed)
        assert gone & leaves or not gone  # the first page to go was a leaf (later ones became leaves)

    @rule(adapter=st.sampled_from(ADAPTERS))
    def drop_adapter(self, adapter: str | None) -> None:
        if any(a == adapter for a, *_ in self.live.values()):
            return  # pinned: a running sequence uses it
        self.cache.drop_adapter(adapter)
        self.epoch[adapter] += 1
        assert adapter not in self.cache.adapters()

    @invariant()
    def pages_partition_and_refs_match(self) -> None:
        if not hasattr(self, "cache"):
            return
        cached = {b.page for b in self.cache.blocks()}
        own = [p for _, _, table, n in self.live.values() for p in table[n:]]
        assert len(own) == len(set(own)) and not cached & set(own)
        assert self.pool.num_kv_pages == len(cached) + len(own)
        refs: dict[int, int] = {}
        for _, _, table, n in self.live.values():
            for page in table[:n]:
                refs[page] = refs.get(page, 0) + 1
        for block in self.cache.blocks():
            assert block.ref_count == refs.get(block.page, 0)
            if block.parent is not None:
                assert block.parent.ref_count >= block.ref_count
                assert self.cache.block(block.parent.page) is block.parent
            assert self.content[block.page][:2] == (block.adapter_id, self.epoch[block.adapter_id])
        assert self.cache.num_evictable_blocks == sum(1 for b in self.cache.blocks() if b.ref_count == 0)
        assert self.pool.num_used_pages + self.pool.num_free_pages == self.pool.num_pages


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
