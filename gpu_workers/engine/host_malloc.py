"""Keep large host allocations on the heap (glibc), for a CPU engine's per-step temporaries.

glibc serves every allocation above its mmap threshold (at most 32 MiB, adjusted dynamically) with a fresh
mmap and returns it with munmap on free, so a prefill step that makes a 40 MB GEMM output per layer page-faults
all of it in again on every call (~20% of a prefill GEMM's time here). Raising the mmap threshold and the trim
threshold once keeps such buffers in the heap for reuse, as tcmalloc or jemalloc would. No-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
HEAP_THRESHOLD_BYTES = 1 << 30  # allocations below this stay on the heap; freed memory above it is trimmed

_applied: list[bool] = []


def keep_large_allocations_on_heap() -> bool:
    """Apply the thresholds once per process; True when glibc accepted them."""
    if _applied:
        return _applied[0]
    ok = False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is not None:
        ok = bool(mallopt(_M_MMAP_THRESHOLD, HEAP_THRESHOLD_BYTES)) and bool(
            mallopt(_M_TRIM_THRESHOLD, HEAP_THRESHOLD_BYTES)
        )
    if not ok:
        logger.info("mallopt unavailable (not glibc?): large host temporaries stay mmap-backed")
    _applied.append(ok)
    return ok
