"""One integer-only pool of device-memory pages shared by KV blocks and adapter weights.

A page is one KV block (`block_size` token slots of K and V over all layers; `page_bytes` in the engine).
An adapter costs its own size in pages (cut along the rank dimension, S-LoRA / FastLibra style, see
`num_pages_for_adapter`; the engine may pass an exact count from its tensor layout). The pool never touches
tensors; allocation returns None when it cannot be satisfied and the caller decides (wait, preempt, evict).

Two layouts (EngineConfig.memory_mode):
- unified (max_kv_pages == num_pages): one budget, no fixed share. Every page can hold a KV block or a
  piece of an adapter; the engine stores an adapter's weights *inside* the KV tensor's pages, so an
  adapter needs a contiguous run of page ids (its tensors are views of that run). KV blocks are taken
  lowest id first and adapter runs highest first, so the two grow towards each other and runs stay
  contiguous; a load for which free pages exist but no run moves KV pages out of the way of one, up to
  a bound (`reserve_moving`, scheduler/core/page_compaction.py), else waits (or evicts idle adapters)
  like any other load that does not fit.
- static (max_kv_pages < num_pages, the vLLM-style baseline): ids [0, max_kv_pages) are KV blocks only,
  ids [max_kv_pages, num_pages) adapter pages only (a fixed adapter share, handed out lazily: the pool
  may have ~1e6 of them); neither side borrows from the other.

Invariant: free pages, KV pages and adapter pages partition range(num_pages).
"""

from __future__ import annotations

import heapq

from scheduler.core.page_compaction import cheapest_window

_FREE, _KV, _ADAPTER = 0, 1, 2


def num_pages_for_adapter(rank: int, num_bytes: int, page_bytes: int) -> int:
    """Pages an adapter of `rank` and `num_bytes` (device bytes) takes when cut along the rank dimension.

    A rank row (its A column and B row in every targeted projection and layer) is never split across
    pages unless it is larger than a page; an adapter costs its own size (no padding to a max rank).
    """
    if num_bytes <= 0:
        return 0
    rank = max(rank, 1)
    row_bytes = -(-num_bytes // rank)
    if row_bytes > page_bytes:
        return rank * -(-row_bytes // page_bytes)
    rows_per_page = page_bytes // row_bytes
    return -(-rank // rows_per_page)


class PagePool:
    """Allocator over page ids [0, num_pages): KV blocks and adapter pages from one budget."""

    def __init__(self, num_pages: int, block_size: int, max_kv_pages: int | None = None) -> None:
        if num_pages <= 0 or block_size <= 0:
            raise ValueError("num_pages and block_size must be positive")
        max_kv_pages = num_pages if max_kv_pages is None else max_kv_pages
        if not 0 < max_kv_pages <= num_pages:
            raise ValueError(f"max_kv_pages must be in [1, {num_pages}], got {max_kv_pages}")
        self.num_pages = num_pages
        self.max_kv_pages = max_kv_pages
        self.block_size = block_size
        # Free KV-addressable ids as a min-heap with lazy deletion: an id taken by an adapter run stays in
        # the heap until popped, and a pop skips ids that are not free (`_owner` is the truth).
        self._free_kv_heap: list[int] = list(range(max_kv_pages))
        self._num_free_kv = max_kv_pages
        # Static layout: adapter-only ids are handed out lazily: returned ids first, then fresh ids
        # [_next_fresh, num_pages).
        self._free_adapter_only: list[int] = []
        self._next_fresh = max_kv_pages
        self._owner = bytearray(num_pages)  # _FREE / _KV / _ADAPTER per page
        self.num_kv_pages = 0
        self.num_adapter_pages = 0

    @property
    def is_unified(self) -> bool:
        """True when every page can hold KV or adapter weights (no fixed adapter share)."""
        return self.max_kv_pages == self.num_pages

    # ---- counts -------------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """KV capacity in blocks (pages the KV cache can address)."""
        return self.max_kv_pages

    @property
    def num_free_blocks(self) -> int:
        """Pages a KV allocation can take now."""
        return self._num_free_kv

    @property
    def num_free_pages(self) -> int:
        """Free pages of either kind."""
        return self._num_free_kv + self._num_free_adapter_only()

    @property
    def max_adapter_pages(self) -> int:
        """The most pages adapters could ever hold (unified: the whole pool; static: the adapter share)."""
        return self.num_pages if self.is_unified else self.num_pages - self.max_kv_pages

    @property
    def num_free_adapter_pages(self) -> int:
        """Free pages an adapter may use (unified: any free page, though a load also needs a run)."""
        return self._num_free_kv if self.is_unified else self._num_free_adapter_only()

    def _num_free_adapter_only(self) -> int:
        return len(self._free_adapter_only) + self.num_pages - self._next_fresh

    def _pop_adapter_only(self) -> int:
        if self._free_adapter_only:
            return self._free_adapter_only.pop()
        self._next_fresh += 1
        return self._next_fresh - 1

    @property
    def num_used_pages(self) -> int:
        """Pages held by KV blocks or adapters."""
        return self.num_kv_pages + self.num_adapter_pages

    def num_blocks_for_tokens(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` KV slots."""
        return -(-num_tokens // self.block_size)

    # ---- KV blocks ----------------------------------------------------------------------------------

    def can_allocate(self, num_blocks: int) -> bool:
        """True when `num_blocks` KV pages are free."""
        return 0 <= num_blocks <= self._num_free_kv

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` KV pages (lowest free ids first); None (and nothing taken) when not enough."""
        if not self.can_allocate(num_blocks):
            return None
        ids: list[int] = []
        while len(ids) < num_blocks:
            page = heapq.heappop(self._free_kv_heap)
            if self._owner[page] == _FREE:
                self._owner[page] = _KV  # claim now: a duplicate heap entry of it must be skipped
                ids.append(page)
        self._num_free_kv -= num_blocks
        self.num_kv_pages += num_blocks
        return ids

    def free(self, block_ids: list[int]) -> None:
        """Return KV pages; freeing a page that is not a KV page in use is a bug and raises."""
        self._give_back(block_ids, _KV)

    def append_slots(self, block_ids: list[int], num_tokens_after: int) -> list[int] | None:
        """Grow a block table so it holds `num_tokens_after` slots; returns the new pages or None."""
        num_missing = self.num_blocks_for_tokens(num_tokens_after) - len(block_ids)
        if num_missing <= 0:
            return []
        new_ids = self.allocate(num_missing)
        if new_ids is not None:
            block_ids.extend(new_ids)
        return new_ids

    # ---- adapter pages ------------------------------------------------------------------------------

    def can_reserve(
        self, num_pages: int, also_free: list[int] | tuple[int, ...] = (), max_moves: int = 0
    ) -> bool:
        """True when `reserve_moving(num_pages, max_moves)` would succeed once the adapter pages `also_free`
        were released."""
        if num_pages <= 0:
            return num_pages == 0
        if not self.is_unified:
            return num_pages <= self._num_free_adapter_only() + len(also_free)
        if num_pages > self._num_free_kv + len(also_free):
            return False
        owner = self._owner
        if also_free:
            owner = bytearray(owner)
            for page in also_free:
                owner[page] = _FREE
        if owner.rfind(bytes(num_pages)) >= 0:
            return True
        return max_moves > 0 and cheapest_window(owner, num_pages, max_moves) is not None

    def reserve(self, num_pages: int) -> list[int] | None:
        """Take pages for adapter weights; None (nothing taken) when they do not fit.

        Unified: one contiguous run of ids, the highest free run (the adapter's tensors are views of it).
        Static: adapter-only ids (not contiguous: the adapter has tensors of its own).
        """
        reservation = self.reserve_moving(num_pages, max_moves=0)
        return None if reservation is None else reservation[0]

    def reserve_moving(
        self, num_pages: int, max_moves: int
    ) -> tuple[list[int], list[tuple[int, int]]] | None:
        """`reserve`, and in a unified pool without a free run of `num_pages`: move up to `max_moves` KV pages
        out of the way (scheduler/core/page_compaction.py) -> (the run, moves (old KV page, new KV page)).

        The caller renames each moved page in its block tables and copies its K and V before the page is
        read or the adapter written. None (nothing taken) when it does not fit.
        """
        if num_pages < 0 or not self.can_reserve(num_pages, max_moves=max_moves):
            return None
        if num_pages == 0:
            return [], []
        moves: list[tuple[int, int]] = []
        if self.is_unified:
            start: int | None = self._owner.rfind(bytes(num_pages))
            if start is None or start < 0:
                start = cheapest_window(self._owner, num_pages, max_moves)
            assert start is not None, "can_reserve found the run or the window"
            ids = list(range(start, start + num_pages))
            moves = self._move_kv_out_of(ids)
            self._num_free_kv -= num_pages  # the ids stay in the heap; pops skip them while taken
        else:
            ids = [self._pop_adapter_only() for _ in range(num_pages)]
        for page in ids:
            self._owner[page] = _ADAPTER
        self.num_adapter_pages += num_pages
        return ids, moves

    def _move_kv_out_of(self, ids: list[int]) -> list[tuple[int, int]]:
        """Give each KV page of `ids` a replacement KV page outside them (lowest free ids first) -> the moves.

        Counts: the window's free pages and the replacements leave the free pages (num_pages in all, as
        for a free run); the KV page count stays."""
        movers = [page for page in ids if self._owner[page] == _KV]
        if not movers:
            return []
        for page in ids:
            self._owner[page] = _ADAPTER  # no replacement may come from the window
        targets: list[int] = []
        while len(targets) < len(movers):
            page = heapq.heappop(self._free_kv_heap)
            if self._owner[page] == _FREE:
                self._owner[page] = _KV
                targets.append(page)
        return list(zip(movers, targets))

    def release(self, page_ids: list[int]) -> None:
        """Give back adapter pages; releasing a page that is not a reserved adapter page raises."""
        self._give_back(page_ids, _ADAPTER)

    def num_kv_addressable(self, page_ids: list[int]) -> int:
        """How many of these pages a KV allocation could use once they are free."""
        return sum(1 for page in page_ids if page < self.max_kv_pages)

    # ---- bookkeeping --------------------------------------------------------------------------------

    def _give_back(self, ids: list[int], owner: int) -> None:
        is_repeated = len(set(ids)) != len(ids)
        for page in ids:  # check everything first: a bad call changes nothing
            if not 0 <= page < self.num_pages or self._owner[page] != owner or is_repeated:
                kind = "KV block" if owner == _KV else "reserved adapter page"
                raise ValueError(f"page {page} is not an allocated {kind}")
        for page in ids:
            self._owner[page] = _FREE
            if page < self.max_kv_pages:
                heapq.heappush(self._free_kv_heap, page)
                self._num_free_kv += 1
            else:
                self._free_adapter_only.append(page)
        if owner == _KV:
            self.num_kv_pages -= len(ids)
        else:
            self.num_adapter_pages -= len(ids)
        if len(self._free_kv_heap) > 4 * self.max_kv_pages:  # bound the stale entries
            self._free_kv_heap = [p for p in range(self.max_kv_pages) if self._owner[p] == _FREE]

    def owner_counts(self) -> tuple[int, int, int]:
        """(free, KV, adapter) page counts recomputed from the owner map (tests check the invariant)."""
        return self._owner.count(_FREE), self._owner.count(_KV), self._owner.count(_ADAPTER)
