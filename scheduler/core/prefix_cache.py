"""Prefix KV cache with FastLibra's dependency rule: a tree virtual root -> (namespace, adapter) -> full KV
blocks.

A cached block is one full KV page of a prompt, keyed by its cache namespace, its adapter id (one id per
adapter version; None is the base model) and the chain of token blocks before it: a block's key is its parent
block and its own `block_size` token ids. The chain is exact (a child dict per node keyed by the token tuple),
so two prompts share a block only when the namespace, the adapter and every token up to the block's end are
equal.

Namespaces close the timing side channel of a shared cache: a hit makes the first token come much sooner, so
if tenant B could hit blocks tenant A inserted, B's TTFT would tell whether A sent a prompt (vLLM's
`cache_salt` answers the same attack). The API gives every request its tenant's own namespace unless an
operator put the tenant in a shared one (api/inference/prepare.py); None is the namespace of direct engine
use without tenants. Blocks are never matched across namespaces, even for the base model or a public adapter.

Ownership: a page inserted here belongs to the cache (it stays a KV page in the `PagePool`); a sequence using
it holds a reference (`ref_count`). A sequence's block table starts with the cached blocks it references
(`Sequence.num_cached_blocks` of them), then its own pages. The cache returns a page to the pool only when
it is evicted (unreferenced leaf) or its adapter leaves the device.

Invariants:
- a referenced block's parent is referenced at least as often (a sequence references a whole chain);
- `evict_leaves` frees only unreferenced leaves (no cached child), least recently used first;
- `drop_adapter` frees every block of an adapter, in every namespace, and is only called when none is
  referenced (the adapter of a running sequence is pinned and never leaves the device): no KV block outlives
  its adapter;
- `match` only returns blocks inserted under the same (namespace, adapter): no block crosses namespaces.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from scheduler.core.page_pool import PagePool

TokenBlock = tuple[int, ...]
RootKey = tuple[str | None, str | None]  # (cache namespace, adapter id): one subtree of the root


@dataclass(eq=False)
class CachedBlock:
    """One cached full KV block (a node of the tree under its namespace and adapter)."""

    page: int
    namespace: str | None
    adapter_id: str | None
    parent: CachedBlock | None
    tokens: TokenBlock
    children: dict[TokenBlock, CachedBlock] = field(default_factory=dict)
    ref_count: int = 0
    last_use: int = 0  # logical clock of the cache

    @property
    def is_leaf(self) -> bool:
        """True when no cached block extends this one."""
        return not self.children


class PrefixCache:
    """Cached full KV blocks per (namespace, adapter), with ref counts, LRU leaf eviction and per-adapter drop."""

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self._roots: dict[RootKey, dict[TokenBlock, CachedBlock]] = {}  # (namespace, adapter) -> first blocks
        self._namespaces: dict[str | None, set[str | None]] = {}  # adapter -> namespaces with a root of it
        self._by_page: dict[int, CachedBlock] = {}
        self._num_adapter_blocks: dict[str | None, int] = {}
        self._num_unreferenced = 0
        # Candidates for eviction, (last_use, page): pushed when a block becomes an unreferenced leaf; an entry
        # whose block changed since (referenced, got a child, used again, freed) is skipped when popped.
        self._leaf_heap: list[tuple[int, int]] = []
        self._clock = 0
        self.num_query_tokens = 0
        self.num_hit_tokens = 0
        self.num_evicted_blocks = 0
        self.num_dropped_blocks = 0

    # ---- counts -------------------------------------------------------------------------------------

    @property
    def num_cached_blocks(self) -> int:
        """Pages the cache owns."""
        return len(self._by_page)

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks no sequence references (all of them can be freed, leaves first)."""
        return self._num_unreferenced

    def adapters(self) -> list[str | None]:
        """Adapters (None = base model) with at least one cached block."""
        return [a for a, n in self._num_adapter_blocks.items() if n > 0]

    def namespaces(self) -> list[str | None]:
        """Namespaces with at least one cached block."""
        return list({namespace for namespace, _ in self._roots})

    def block(self, page: int) -> CachedBlock | None:
        """The cached block on this page, if the cache owns it."""
        return self._by_page.get(page)

    def blocks(self) -> list[CachedBlock]:
        """Every cached block (any order)."""
        return list(self._by_page.values())

    # ---- lookup and references ----------------------------------------------------------------------

    def match(self, adapter_id: str | None, token_ids: list[int], *, namespace: str | None) -> list[int]:
        """Pages of the longest chain of full blocks cached in `namespace` for `adapter_id` that prefixes
        `token_ids` (no reference taken).

        Never the whole sequence: at least its last token is left to compute, so a logit is produced.
        """
        bs = self.block_size
        children = self._roots.get((namespace, adapter_id))
        pages: list[int] = []
        for i in range((len(token_ids) - 1) // bs):
            if not children:
                break
            found = children.get(tuple(token_ids[i * bs : (i + 1) * bs]))
            if found is None:
                break
            pages.append(found.page)
            children = found.children
        return pages

    def acquire(self, pages: list[int]) -> None:
        """Take one reference on each cached page (a sequence starts using them)."""
        now = self._tick()
        for page in pages:
            block = self._by_page[page]
            if block.ref_count == 0:
                self._num_unreferenced -= 1
            block.ref_count += 1
            block.last_use = now

    def release(self, pages: list[int]) -> None:
        """Drop one reference on each cached page (a sequence stopped using them); they stay cached."""
        now = self._tick()
        for page in pages:
            block = self._by_page[page]
            assert block.ref_count > 0, f"cached page {page} released more often than acquired"
            block.ref_count -= 1
            block.last_use = now
            if block.ref_count == 0:
                self._num_unreferenced += 1
                self._push_if_evictable(block)

    def record_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted sequence's lookup (for the hit-rate stats)."""
        self.num_query_tokens += num_query_tokens
        self.num_hit_tokens += num_hit_tokens

    # ---- insertion ----------------------------------------------------------------------------------

    def insert(
        self,
        adapter_id: str | None,
        token_ids: list[int],
        block_table: list[int],
        num_cached: int,
        num_full: int,
        *,
        namespace: str | None,
    ) -> int:
        """Hand a sequence's computed full blocks [num_cached, num_full) to the cache under `namespace`;
        returns the new num_cached.

        `block_table[:num_cached]` must already be cached blocks the sequence references (matched in the
        same namespace); each block inserted keeps one reference (the sequence's). Stops at the first block
        whose key another page already holds (the sequence keeps its own page from there on).
        """
        bs = self.block_size
        parent = self._by_page[block_table[num_cached - 1]] if num_cached else None
        now = self._tick()
        i = num_cached
        while i < num_full:
            siblings = parent.children if parent is not None else self._root(namespace, adapter_id)
            key = tuple(token_ids[i * bs : (i + 1) * bs])
            page = block_table[i]
            if key in siblings or page in self._by_page:
                break
            block = CachedBlock(page, namespace, adapter_id, parent, key, ref_count=1, last_use=now)
            siblings[key] = block
            self._by_page[page] = block
            self._num_adapter_blocks[adapter_id] = self._num_adapter_blocks.get(adapter_id, 0) + 1
            parent = block
            i += 1
        return i

    # ---- freeing ------------------------------------------------------------------------------------

    def evict_leaves(self, num_blocks: int) -> int:
        """Free up to `num_blocks` unreferenced leaf blocks, least recently used first (a parent becomes a
        candidate once its last child is gone); returns how many pages went back to the pool."""
        if num_blocks <= 0 or not self._num_unreferenced:
            return 0
        heap = self._leaf_heap
        freed: list[int] = []
        while heap and len(freed) < num_blocks:
            last_use, page = heapq.heappop(heap)
            block = self._by_page.get(page)
            if block is None or block.last_use != last_use or block.ref_count or not block.is_leaf:
                continue  # stale entry
            parent = block.parent
            self._unlink(block)
            freed.append(page)
            if parent is not None:
                self._push_if_evictable(parent)
        self.pool.free(freed)
        self.num_evicted_blocks += len(freed)
        return len(freed)

    def move_pages(self, moves: list[tuple[int, int]]) -> None:
        """The pool moved KV pages (old, new) out of an adapter's run: the cached blocks on them live on the new
        pages from now on (same keys, references and recency)."""
        moved = [(self._by_page.pop(old), new) for old, new in moves if old in self._by_page]
        for block, new in moved:
            block.page = new
            self._by_page[new] = block
            self._push_if_evictable(block)  # its heap entry names the old page (skipped as stale)

    def drop_adapter(self, adapter_id: str | None) -> int:
        """Free every cached block of an adapter that is leaving the device, in every namespace; returns the
        pages freed.

        The adapter must have no running sequence (then none of its blocks is referenced): asserted.
        """
        roots = [(namespace, adapter_id) for namespace in self._namespaces.get(adapter_id, ())]
        if not roots:
            return 0
        stack = [block for root in roots for block in self._roots[root].values()]
        blocks: list[CachedBlock] = []
        while stack:
            block = stack.pop()
            assert block.ref_count == 0, (
                f"adapter {adapter_id!r} left the device while a sequence uses its cached page {block.page}"
            )
            stack.extend(block.children.values())
            blocks.append(block)
        for root in roots:
            del self._roots[root]
        del self._namespaces[adapter_id]
        freed = [block.page for block in blocks]
        for page in freed:
            del self._by_page[page]
        self._num_unreferenced -= len(freed)
        self._num_adapter_blocks.pop(adapter_id, None)
        self.pool.free(freed)
        self.num_dropped_blocks += len(freed)
        return len(freed)

    def _root(self, namespace: str | None, adapter_id: str | None) -> dict[TokenBlock, CachedBlock]:
        """The first blocks of (namespace, adapter), created empty when missing."""
        root = self._roots.get((namespace, adapter_id))
        if root is None:
            root = self._roots[(namespace, adapter_id)] = {}
            self._namespaces.setdefault(adapter_id, set()).add(namespace)
        return root

    def _unlink(self, block: CachedBlock) -> None:
        """Remove an unreferenced leaf from the tree (its page is freed by the caller)."""
        root = (block.namespace, block.adapter_id)
        siblings = block.parent.children if block.parent is not None else self._roots[root]
        del siblings[block.tokens]
        if block.parent is None and not siblings:
            del self._roots[root]
            namespaces = self._namespaces[block.adapter_id]
            namespaces.discard(block.namespace)
            if not namespaces:
                del self._namespaces[block.adapter_id]
        del self._by_page[block.page]
        self._num_unreferenced -= 1
        self._num_adapter_blocks[block.adapter_id] -= 1

    def _push_if_evictable(self, block: CachedBlock) -> None:
        if block.ref_count == 0 and block.is_leaf:
            heapq.heappush(self._leaf_heap, (block.last_use, block.page))
            if len(self._leaf_heap) > 2 * len(self._by_page) + 64:  # drop stale entries
                self._leaf_heap = [
                    (b.last_use, b.page) for b in self._by_page.values() if b.ref_count == 0 and b.is_leaf
                ]
                heapq.heapify(self._leaf_heap)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock
