"""One integer-only pool of device-memory pages shared by KV blocks and adapter weights.

A page is one KV block (`block_size` token slots of K and V over all layers; `page_bytes` in the engine).
KV blocks and adapter weights (cut along the rank dimension, S-LoRA / FastLibra style: an adapter of rank r
takes the pages that hold its r rank rows, see `num_pages_for_adapter`) come out of the same free pages.
The pool never touches tensors; allocation returns None when it cannot be satisfied and the caller decides
(wait, preempt, evict).

Page ids [0, max_kv_pages) are KV-addressable (the engine's KV tensor covers exactly them); ids
[max_kv_pages, num_pages) can hold adapter weights only. Adapters take those first and spill into
KV-addressable pages only when they are used up, so KV capacity stays what it was until adapter rows are
stored inside the KV tensor itself (then max_kv_pages == num_pages; the [Adapter memory] issue).

Invariant: free pages, KV pages and adapter pages partition range(num_pages).
"""

from __future__ import annotations

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
    """Free-list allocator over page ids [0, num_pages): KV blocks and adapter pages from one budget."""

    def __init__(self, num_pages: int, block_size: int, max_kv_pages: int | None = None) -> None:
        if num_pages <= 0 or block_size <= 0:
            raise ValueError("num_pages and block_size must be positive")
        max_kv_pages = num_pages if max_kv_pages is None else max_kv_pages
        if not 0 < max_kv_pages <= num_pages:
            raise ValueError(f"max_kv_pages must be in [1, {num_pages}], got {max_kv_pages}")
        self.num_pages = num_pages
        self.max_kv_pages = max_kv_pages
        self.block_size = block_size
        self._free_kv: list[int] = list(range(max_kv_pages - 1, -1, -1))  # popped from the end: 0 first
        # Adapter-only ids are handed out lazily (the pool may have ~1e6 of them): returned ids first, then
        # fresh ids [_next_fresh, num_pages).
        self._free_adapter_only: list[int] = []
        self._next_fresh = max_kv_pages
        self._owner = bytearray(num_pages)  # _FREE / _KV / _ADAPTER per page
        self.num_kv_pages = 0
        self.num_adapter_pages = 0
        self.num_spilled_adapter_pages = 0  # adapter pages on KV-addressable ids

    # ---- counts -------------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """KV capacity in blocks (pages the KV cache can address)."""
        return self.max_kv_pages

    @property
    def num_free_blocks(self) -> int:
        """Pages a KV allocation can take now."""
        return len(self._free_kv)

    @property
    def num_free_pages(self) -> int:
        """Pages an adapter reservation can take now."""
        return len(self._free_kv) + self._num_free_adapter_only()

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
        return 0 <= num_blocks <= len(self._free_kv)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` KV pages; None (and nothing taken) when not enough are free."""
        if not self.can_allocate(num_blocks):
            return None
        ids = [self._free_kv.pop() for _ in range(num_blocks)]
        self._take(ids, _KV)
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

    def reserve(self, num_pages: int) -> list[int] | None:
        """Take pages for adapter weights (adapter-only pages first); None (nothing taken) when full."""
        if not 0 <= num_pages <= self.num_free_pages:
            return None
        num_other = min(num_pages, self._num_free_adapter_only())
        ids = [self._pop_adapter_only() for _ in range(num_other)]
        ids += [self._free_kv.pop() for _ in range(num_pages - num_other)]
        self._take(ids, _ADAPTER)
        self.num_spilled_adapter_pages += num_pages - num_other
        return ids

    def release(self, page_ids: list[int]) -> None:
        """Give back adapter pages; releasing a page that is not a reserved adapter page raises."""
        self._give_back(page_ids, _ADAPTER)

    def move_out_of_kv(self, page: int) -> int | None:
        """Move an adapter page from a KV-addressable id to a free adapter-only id; the new id, or None
        when no adapter-only page is free (today adapter pages are accounting only, so a move copies
        nothing; once adapter rows live in the pages it is a device copy)."""
        if self._owner[page] != _ADAPTER or page >= self.max_kv_pages or not self._num_free_adapter_only():
            return None
        new_page = self._pop_adapter_only()
        self._owner[new_page], self._owner[page] = _ADAPTER, _FREE
        self._free_kv.append(page)
        self.num_spilled_adapter_pages -= 1
        return new_page

    def num_kv_addressable(self, page_ids: list[int]) -> int:
        """How many of these pages a KV allocation could use once they are free."""
        return sum(1 for page in page_ids if page < self.max_kv_pages)

    # ---- bookkeeping --------------------------------------------------------------------------------

    def _take(self, ids: list[int], owner: int) -> None:
        for page in ids:
            self._owner[page] = owner
        if owner == _KV:
            self.num_kv_pages += len(ids)
        else:
            self.num_adapter_pages += len(ids)

    def _give_back(self, ids: list[int], owner: int) -> None:
        is_repeated = len(set(ids)) != len(ids)
        for page in ids:  # check everything first: a bad call changes nothing
            if self._owner[page] != owner or is_repeated:
                kind = "KV block" if owner == _KV else "reserved adapter page"
                raise ValueError(f"page {page} is not an allocated {kind}")
        for page in ids:
            self._owner[page] = _FREE
            (self._free_kv if page < self.max_kv_pages else self._free_adapter_only).append(page)
        if owner == _KV:
            self.num_kv_pages -= len(ids)
        else:
            self.num_adapter_pages -= len(ids)
            self.num_spilled_adapter_pages -= self.num_kv_addressable(ids)
