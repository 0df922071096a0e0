"""A sequence's KV pages: its own pages from the pool and the cached prefix blocks it shares.

Growing a block table frees room in this order: unreferenced cached prefix blocks (leaves, LRU), then
adapters holding KV-addressable pages that no running request uses (`AdapterResidency.evict_for_kv`).
Invariant: `seq.block_table[: seq.num_cached_blocks]` are prefix-cache blocks seq holds a reference to; the
rest are seq's own pages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from scheduler.core.adapter_residency import AdapterResidency
from scheduler.core.page_pool import PagePool
from scheduler.core.prefix_cache import PrefixCache
from scheduler.core.sequence import Sequence
from scheduler.core.step_plan import StepPlan


class SequenceBlocks:
    """Allocates, caches and frees sequences' KV pages over one page pool and an optional prefix cache."""

    def __init__(
        self,
        pool: PagePool,
        residency: AdapterResidency,
        prefix_cache: PrefixCache | None = None,
        sequences: Callable[[], Iterable[Sequence]] = tuple,
    ) -> None:
        """`sequences`: every sequence that may hold pages (running and waiting), whose block tables follow
        the KV pages an adapter load moves (`move_pages`)."""
        self.pool = pool
        self.residency = residency
        self.prefix_cache = prefix_cache
        self.sequences = sequences
        self._moves: list[tuple[int, int]] = []  # made since the last `take_moves`
        residency.on_kv_moves.append(self.move_pages)
        if prefix_cache is not None:  # no KV block outlives its adapter
            residency.on_leave_device.append(prefix_cache.drop_adapter)

    def move_pages(self, moves: list[tuple[int, int]]) -> None:
        """The pool moved KV pages (old, new) out of an adapter's run: rename them in every block table and in
        the prefix cache; the moves wait for `take_moves` (the step plan's copies)."""
        renamed = dict(moves)
        for seq in self.sequences():
            seq.block_table = [renamed.get(page, page) for page in seq.block_table]
        if self.prefix_cache is not None:
            self.prefix_cache.move_pages(moves)
        self._moves += moves

    def take_moves(self) -> list[tuple[int, int]]:
        """The moves made since the last call, in order."""
        moves, self._moves = self._moves, []
        return moves

    def num_reclaimable_blocks(self) -> int:
        """KV pages a new sequence could get: free ones plus unreferenced cached blocks."""
        cache = self.prefix_cache
        return self.pool.num_free_blocks + (cache.num_evictable_blocks if cache is not None else 0)

    def free(self, seq: Sequence) -> None:
        """Release seq's cached blocks and free its own pages."""
        if seq.num_cached_blocks:
            assert self.prefix_cache is not None
            self.prefix_cache.release(seq.block_table[: seq.num_cached_blocks])
        if seq.block_table:
            self.pool.free(seq.block_table[seq.num_cached_blocks :])
            seq.block_table = []
        seq.num_cached_blocks = 0

    def cache_computed(self, seq: Sequence) -> None:
        """Hand seq's computed full prompt blocks to the prefix cache (seq keeps a reference to each)."""
        cache = self.prefix_cache
        if cache is None or seq.is_finished:
            return
        num_full = min(seq.num_computed_tokens, seq.num_prompt_tokens) // self.pool.block_size
        if num_full > seq.num_cached_blocks:
            seq.num_cached_blocks = cache.insert(
                seq.adapter_id,
                seq.token_ids,
                seq.block_table,
                seq.num_cached_blocks,
                num_full,
                namespace=seq.cache_namespace,
            )

    def reuse_cached_prefix(self, seq: Sequence) -> None:
        """Start a waiting seq from the longest cached prefix of its adapter in its cache namespace (at least one
        token stays). A seq asking for prompt logprobs starts from nothing: they need every prompt position's
        logits (vLLM v1 skips its cache for them too)."""
        if self.prefix_cache is None or seq.sampling_params.prompt_logprobs is not None:
            return
        pages = self.prefix_cache.match(seq.adapter_id, seq.token_ids, namespace=seq.cache_namespace)
        self.prefix_cache.acquire(pages)
        seq.block_table = list(pages)
        seq.num_cached_blocks = len(pages)
        seq.num_computed_tokens = len(pages) * self.pool.block_size

    def append_slots(self, seq: Sequence, num_new: int, plan: StepPlan) -> bool:
        """Grow seq's block table for num_new more tokens (evicting unreferenced cached blocks, then idle
        adapters from KV-addressable pages, into `plan`, if needed); False when there is no room."""
        num_tokens_after = seq.num_computed_tokens + num_new
        if num_tokens_after <= len(seq.block_table) * self.pool.block_size:
            return True  # its pages hold them already (the pool's append_slots would add none)
        if self.pool.append_slots(seq.block_table, num_tokens_after) is not None:
            return True
        num_missing = self.pool.num_blocks_for_tokens(num_tokens_after) - len(seq.block_table)
        if self.prefix_cache is not None and self.prefix_cache.num_evictable_blocks:
            self.prefix_cache.evict_leaves(num_missing - self.pool.num_free_blocks)
            if self.pool.append_slots(seq.block_table, num_tokens_after) is not None:
                return True
        evicted = self.residency.evict_for_kv(num_missing, keep=seq.adapter_id)
        if not evicted:
            return False
        plan.adapter_evictions.extend(evicted)
        return self.pool.append_slots(seq.block_table, num_tokens_after) is not None

    def drop_cached_blocks_for_adapters(self) -> bool:
        """In a unified pool, unreferenced cached prefix blocks may hold the pages (or break up the run) an
        adapter load needs: a request's load outranks cached KV, so evict them all; True if any went."""
        cache = self.prefix_cache
        if cache is None or not self.pool.is_unified or not cache.num_evictable_blocks:
            return False
        return cache.evict_leaves(cache.num_evictable_blocks) > 0
