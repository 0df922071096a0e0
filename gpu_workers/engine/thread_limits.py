"""One OpenMP thread for each of the engine's helper threads (CPU-assisted prefill, adapter preparation and
copies, grammar masks).

Every OS thread that runs a parallel torch op gets an OpenMP team of its own (torch.get_num_threads() threads).
Once libgomp manages more threads than the machine has CPUs it stops spinning between parallel regions
(its "throttled" spin count) for every team, the engine thread's included, so each of the ~120 parallel
regions of a decode step then pays a futex wake-up. Measured on a 2-core AMD EPYC (SmolLM2-135M, bf16, 2
threads): one CPU-assisted prefill on a helper thread turned a 1-row decode step from 16-17 ms into 27-28 ms
for the rest of the process, base-model rows included. A helper thread therefore runs its torch ops on
itself alone (`limit_this_thread(1)`): no second team, and the helper's work is small beside a step's.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

logger = logging.getLogger(__name__)


@functools.cache
def _omp_set_num_threads() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """libgomp's omp_set_num_threads as loaded by torch (same soname), or None (another OpenMP runtime)."""
    for name in ("libgomp.so.1", "libiomp5.so", "libomp.so"):
        try:
            function = ctypes.CDLL(name).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        function.argtypes, function.restype = [ctypes.c_int], None
        return function
    logger.warning("no OpenMP runtime found; helper threads keep torch's thread count")
    return None


def limit_this_thread(num_threads: int) -> None:
    """Make the calling thread's parallel torch ops use `num_threads` threads; other threads keep theirs.

    torch.set_num_threads would also change the count every thread started later initialises with (a
    process-wide setting), so this sets the OpenMP runtime's per-thread value, after torch's own per-thread
    initialisation (which would otherwise overwrite it on the thread's first parallel op).
    """
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    torch.get_num_threads()  # torch's lazy per-thread initialisation happens here, before ours
    function = _omp_set_num_threads()
    if function is not None:
        function(num_threads)
