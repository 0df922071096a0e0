"""Prefix KV cache (root -> (namespace, adapter) -> blocks): matching, namespaces, ref counts, leaf eviction,
adapter drop.

The stateful test keeps a model of what each page holds (namespace, adapter, adapter load epoch, the token
prefix up to the block's end) and checks that every page a lookup returns holds exactly the KV the prompt
needs and was inserted in the lookup's namespace.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduler.core.page_pool import PagePool
from scheduler.core.prefix_cache import PrefixCache

BS = 4


def computed(
    cache: PrefixCache, adapter: str | None, tokens: list[int], namespace: str | None = None
) -> list[int]:
    """Allocate a sequence's pages, 'compute' them and insert its full blocks; returns its block table."""
    table = cache.pool.allocate(cache.pool.num_blocks_for_tokens(len(tokens)))
    assert table is not None
    assert (
        cache.insert(adapter, tokens, table, 0, len(tokens) // BS, namespace=namespace) == len(tokens) // BS
    )
    return table


def match(
    cache: PrefixCache, adapter: str | None, tokens: list[int], namespace: str | None = None
) -> list[int]:
    return cache.match(adapter, tokens, namespace=namespace)


def test_lookup_returns_the_longest_full_block_chain_but_never_the_whole_prompt() -> None:
    cache = PrefixCache(PagePool(16, BS))
    table = computed(cache, "a", list(range(12)))  # three full blocks
    assert match(cache, "a", list(range(12)) + [99]) == table  # all three, the 13th token is computed
    assert match(cache, "a", list(range(12))) == table[:2]  # the last token must be computed
    assert match(cache, "a", list(range(9))) == table[:2]
    assert match(cache, "a", [0, 1, 2, 3, 4, 5, 6, 0, 8]) == table[:1]  # differs inside block 2
    assert match(cache, "a", [7] + list(range(1, 12))) == []


def test_other_adapter_and_base_model_have_their_own_subtrees() -> None:
    cache = PrefixCache(PagePool(16, BS))
    computed(cache, "a@v1", list(range(8)))
    prompt = list(range(8)) + [1]
    assert match(cache, "a@v2", prompt) == [] and match(cache, None, prompt) == []
    base = computed(cache, None, list(range(8)))
    assert match(cache, None, prompt) == base
    assert set(cache.adapters()) == {"a@v1", None}


def test_referenced_blocks_are_never_evicted_and_leaves_go_first() -> None:
    pool = PagePool(16, BS)
    cache = PrefixCache(pool)
    table = computed(cache, "a", list(range(12)))
    cache.release(table)  # the sequence finished: three unreferenced blocks
    other = computed(cache, "b", list(range(4)))  # still referenced
    assert cache.num_evictable_blocks == 3
    assert cache.evict_leaves(1) == 1
    assert match(cache, "a", list(range(13))) == table[:2]  # the deepest block went, not the root one
    assert cache.evict_leaves(10) == 2
    assert match(cache, "b", list(range(5))) == other and cache.num_cached_blocks == 1
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
    assert match(cache, "a", [1, 1, 1, 1, 0]) == old and match(cache, "a", [2, 2, 2, 2, 0]) == []


def test_drop_adapter_frees_all_its_blocks_and_refuses_referenced_ones() -> None:
    pool = PagePool(16, BS)
    cache = PrefixCache(pool)
    table = computed(cache, "a", list(range(8)))
    computed(cache, "a", [5] * 8)
    with pytest.raises(AssertionError, match="left the device"):
        cache.drop_adapter("a")
    cache.release(table)
    cache.release(match(cache, "a", [5] * 9))
    assert cache.drop_adapter("a") == 4
    assert cache.num_cached_blocks == 0 and pool.num_kv_pages == 0 and cache.adapters() == []
    assert match(cache, "a", list(range(9))) == []


def test_insert_stops_where_another_page_already_holds_the_block() -> None:
    cache = PrefixCache(PagePool(16, BS))
    first = computed(cache, "a", list(range(8)))
    twin = cache.pool.allocate(2)
    assert twin is not None
    assert (
        cache.insert("a", list(range(8)), twin, 0, 2, namespace=None) == 0
    )  # computed concurrently: keeps its own pages
    assert match(cache, "a", list(range(9))) == first


def test_a_block_is_only_matched_in_the_namespace_that_inserted_it() -> None:
    cache = PrefixCache(PagePool(16, BS))
    prompt = list(range(8)) + [1]
    for adapter in (None, "public@v1"):  # the base model and a public adapter alike
        mine = computed(cache, adapter, list(range(8)), namespace="tenant:a")
        assert match(cache, adapter, prompt, "tenant:a") == mine  # the tenant's own repeat hits
        assert match(cache, adapter, prompt, "tenant:b") == []  # another tenant gets nothing
        assert match(cache, adapter, prompt, None) == []  # nor does direct engine use
    assert sorted(cache.namespaces()) == ["tenant:a"]


def test_the_same_prompt_in_two_namespaces_gets_two_chains() -> None:
    cache = PrefixCache(PagePool(16, BS))
    a = computed(cache, None, list(range(8)), namespace="tenant:a")
    b = computed(cache, None, list(range(8)), namespace="tenant:b")
    assert not set(a) & set(b) and cache.num_cached_blocks == 4
    assert match(cache, None, list(range(9)), "tenant:b") == b
    assert sorted(cache.namespaces()) == ["tenant:a", "tenant:b"]


def test_drop_adapter_frees_its_blocks_in_every_namespace_and_only_its_own() -> None:
    pool = PagePool(16, BS)
    cache = PrefixCache(pool)
    for namespace in ("tenant:a", "tenant:b", None):
        cache.release(computed(cache, "pub", list(range(8)), namespace))
    base = computed(cache, None, list(range(8)), "tenant:a")
    assert cache.drop_adapter("pub") == 6
    assert cache.adapters() == [None] and cache.namespaces() == ["tenant:a"]
    assert all(match(cache, "pub", list(range(9)), ns) == [] for ns in ("tenant:a", "tenant:b", None))
    assert match(cache, None, list(range(9)), "tenant:a") == base and pool.num_kv_pages == 2


def test_evicting_a_namespace_s_last_block_forgets_the_namespace() -> None:
    cache = PrefixCache(PagePool(16, BS))
    cache.release(computed(cache, "pub", list(range(4)), "tenant:a"))
    assert cache.evict_leaves(1) == 1
    assert cache.namespaces() == [] and cache.adapters() == [] and cache.drop_adapter("pub") == 0


ADAPTERS = ["x", "y", None]
NAMESPACES = ["tenant:a", "tenant:b", None]


class PrefixCacheMachine(RuleBasedStateMachine):
    """Sequences start (lookup + own pages), compute, insert, finish; leaves are evicted, adapters dropped."""

    @initialize(num_pages=st.integers(4, 24))
    def setup(self, num_pages: int) -> None:
        self.pool = PagePool(num_pages, BS)
        self.cache = PrefixCache(self.pool)
        self.live: dict[
            int, tuple[str | None, list[int], list[int], int]
        ] = {}  # id -> adapter, tokens, table, n
        # page -> what its KV is: (namespace that computed it, adapter, adapter epoch, token prefix)
        self.content: dict[int, tuple[str | None, str | None, int, tuple[int, ...]]] = {}
        self.epoch = {a: 0 for a in ADAPTERS}  # bumped when an adapter leaves the device
        self.next_id = 0

    @rule(
        namespace=st.sampled_from(NAMESPACES),
        adapter=st.sampled_from(ADAPTERS),
        tokens=st.lists(st.integers(0, 1), min_size=1, max_size=14),
    )
    def start(self, namespace: str | None, adapter: str | None, tokens: list[int]) -> None:
        matched = self.cache.match(adapter, tokens, namespace=namespace)
        for i, page in enumerate(
            matched
        ):  # every hit: this namespace's and adapter's (epoch) KV of this prefix
            assert self.content[page] == (
                namespace,
                adapter,
                self.epoch[adapter],
                tuple(tokens[: (i + 1) * BS]),
            )
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
            self.content[table[i]] = (namespace, adapter, self.epoch[adapter], tuple(tokens[: (i + 1) * BS]))
        num_cached = self.cache.insert(
            adapter, tokens, table, len(matched), len(tokens) // BS, namespace=namespace
        )
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
        assert all(b.adapter_id != adapter for b in self.cache.blocks())  # gone from every namespace

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
            assert self.content[block.page][:3] == (
                block.namespace,
                block.adapter_id,
                self.epoch[block.adapter_id],
            )
            if block.parent is not None:
                assert (block.parent.namespace, block.parent.adapter_id) == (
                    block.namespace,
                    block.adapter_id,
                )
        assert set(self.cache.namespaces()) == {b.namespace for b in self.cache.blocks()}
        assert self.cache.num_evictable_blocks == sum(1 for b in self.cache.blocks() if b.ref_count == 0)
        assert self.pool.num_used_pages + self.pool.num_free_pages == self.pool.num_pages


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
