"""Integer-only KV page allocator.

The manager only counts pages (blocks of `block_size` token slots); it never touches tensors. Pages can be
reserved for non-KV users (a later issue stores adapter weights in the same pool): `reserve` takes pages
out of the free pool and `release` puts them back. Allocation returns None when it cannot be satisfied;
the caller decides whether to wait, preempt or evict.
"""

from __future__ import annotations


class BlockManager:
    """Free-list allocator over `num_blocks` page ids [0, num_blocks)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Invariant: free ids, allocated ids and reserved ids partition range(num_blocks).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._is_used: list[bool] = [False] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Pages available to allocate now."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Pages held by sequences or reservations."""
        return self.num_blocks - len(self._free)

    def num_blocks_for_tokens(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` slots."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        """True when `num_blocks` pages are free."""
        return 0 <= num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` pages; None (and nothing taken) when not enough are free."""
        if not self.can_allocate(num_blocks):
            return None
        ids = [self._free.pop() for _ in range(num_blocks)]
        for block_id in ids:
            self._is_used[block_id] = True
        return ids

    def free(self, block_ids: list[int]) -> None:
        """Return pages to the pool; freeing a page that is not in use is a bug and raises."""
        for block_id in block_ids:
            if not self._is_used[block_id]:
                raise ValueError(f"block {block_id} is not allocated")
            self._is_used[block_id] = False
            self._free.append(block_id)

    def append_slots(self, block_ids: list[int], num_tokens_after: int) -> list[int] | None:
        """Grow a block table so it holds `num_tokens_after` slots; returns the new pages or None."""
        num_missing = self.num_blocks_for_tokens(num_tokens_after) - len(block_ids)
        if num_missing <= 0:
            return []
        new_ids = self.allocate(num_missing)
        if new_ids is not None:
            block_ids.extend(new_ids)
        return new_ids

    def reserve(self, num_blocks: int) -> list[int] | None:
        """Take pages for a non-KV owner (e.g. adapter weights); same semantics as allocate."""
        return self.allocate(num_blocks)

    def release(self, block_ids: list[int]) -> None:
        """Give back reserved pages."""
        self.free(block_ids)
