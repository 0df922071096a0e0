"""Compaction of KV blocks out of the way of an adapter run (unified page pool, scheduler/core/page_pool.py).

In a unified pool an adapter needs one contiguous run of page ids, and KV blocks scattered through the free
space can leave many free pages but no run long enough (measured in the digital twin: 700-1000 free pages
and no run over ~300 for a 384-page adapter, in 11-66% of the steps at load 0.8-1.1). A KV block is only an
id in a block table, so the scheduler can move it: pick the window of `num_pages` ids that holds no adapter
page and the fewest KV pages (`cheapest_window`), give each of those KV pages a replacement outside the
window, rename them in every block table and in the prefix cache, and have the executor copy each page's K
and V before anything else of the step (`StepPlan.kv_block_moves`). The adapter's LoRA kernels still see one
contiguous run. `max_moves` bounds the KV pages one reservation may move (the copy a step pays for; 0: no
compaction).

Why fewest KV pages first and the highest start on a tie: the copy is the cost, and adapter runs are taken
highest first, so a high window keeps the adapters together and the KV region below them whole.
"""

from __future__ import annotations

KV_OWNER = 1  # page_pool._KV
ADAPTER_OWNER = 2  # page_pool._ADAPTER


def cheapest_window(owner: bytes | bytearray, num_pages: int, max_moves: int) -> int | None:
    """Start of the window [s, s + num_pages) of `owner` (one byte per page: free 0, KV 1, adapter 2) with no
    adapter page and the fewest KV pages, at most `max_moves` of them (ties: the highest start); None when
    there is none."""
    if num_pages <= 0 or num_pages > len(owner):
        return None
    best: tuple[int, int] | None = None  # (num_kv, -start)
    start = 0
    for segment in bytes(owner).split(bytes([ADAPTER_OWNER])):
        if len(segment) >= num_pages:
            found = _cheapest_in_segment(segment, num_pages)
            candidate = (found[0], -(start + found[1]))
            if best is None or candidate < best:
                best = candidate
        start += len(segment) + 1
    if best is None or best[0] > max_moves:
        return None
    return -best[1]


def _cheapest_in_segment(segment: bytes, num_pages: int) -> tuple[int, int]:
    """(fewest KV pages, highest offset with that many) over the windows of a segment without adapter pages."""
    num_kv = segment.count(KV_OWNER, 0, num_pages)
    best = (num_kv, 0)
    for offset in range(1, len(segment) - num_pages + 1):
        num_kv += (segment[offset + num_pages - 1] == KV_OWNER) - (segment[offset - 1] == KV_OWNER)
        if num_kv <= best[0]:
            best = (num_kv, offset)
    return best


def compose_moves(moves: list[tuple[int, int]], new_moves: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`moves` followed by `new_moves` as one set of moves from distinct pages to distinct pages (a page moved
    twice in one step goes once, from where it was to where it ends), so the copies may run in any order."""
    destination = dict(moves)  # page the block was on at the step's start -> page it is on now
    source_of = {new: old for old, new in moves}
    for old, new in new_moves:
        if new in source_of:  # `new` held a moved block that was freed since: that copy is dead
            del destination[source_of.pop(new)]
        origin = source_of.pop(old, old)
        destination[origin] = new
        source_of[new] = origin
    return list(destination.items())
