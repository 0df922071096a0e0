"""Adapter preparations timed as a server runs them: on a helper thread while the engine steps a batch.

A cold adapter's host copy is made on the copier's preparer thread (read, validate, pack) while the step loop
serves the other requests. On a CPU engine both share the machine's cores, so each slows the other: the
preparation takes longer than alone, and the steps that run beside it cost more than their price (measured
on a 2-core AMD EPYC: preparations 1.8x, steps 2.3x, `benchmarks/twin_step_audit.py`). `time_prepares`
prepares each adapter on a thread limited as the preparer is (gpu_workers/engine/thread_limits.py) while the
engine decodes a small batch, and returns the preparations' seconds and each step's time beside one relative
to the batch's steps alone: the twin's prepare cost and its `prepare_step_factor`.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_workers.engine.grid_timer import abort_grid_requests, add_grid_request
from gpu_workers.engine.thread_limits import limit_this_thread

NUM_BATCH_ROWS = 4  # the decoding batch the preparations run beside
NUM_CLEAN_STEPS = 4  # steps timed alone before each preparation (their median is the reference)
PROMPT_TOKENS = 32


@dataclass(frozen=True)
class TimedPrepare:
    """One preparation: its adapter's bytes, its seconds beside the steps, and the steps that ran wholly within
    it, each as its time over the median step of the same batch alone."""

    num_bytes: int
    seconds: float
    step_ratios: tuple[float, ...]


def time_prepares(
    engine: Any, prepare: Callable[[str, Path], Any], adapter_dirs: dict[int, Path], num_repeats: int
) -> list[TimedPrepare]:
    """Prepare each adapter of `adapter_dirs` `num_repeats` times (`prepare(id, path)` returns a host copy with
    `num_bytes`) on a helper thread while the engine decodes NUM_BATCH_ROWS base-model rows."""
    from scheduler.core.sampling import SamplingParams

    max_tokens = engine.runner.geometry.max_model_len - PROMPT_TOKENS  # rows that outlast any preparation
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    timed: list[TimedPrepare] = []
    for rank, path in sorted(adapter_dirs.items()):
        for repeat in range(max(1, num_repeats)):
            request_ids = [
                add_grid_request(engine, params, None, PROMPT_TOKENS, i) for i in range(NUM_BATCH_ROWS)
            ]
            try:
                engine.step()  # the prefill
                clean = statistics.median(_timed_step(engine)[1] for _ in range(NUM_CLEAN_STEPS))
                timed.append(_beside_steps(engine, prepare, f"prepare-timer-{rank}-{repeat}", path, clean))
            finally:
                abort_grid_requests(engine, request_ids)
    return timed


def prepare_step_factor(timed: list[TimedPrepare]) -> float:
    """The median step time beside a preparation over the same step alone (1.0: none ran wholly beside one)."""
    ratios = [ratio for prepare in timed for ratio in prepare.step_ratios]
    return max(1.0, statistics.median(ratios)) if ratios else 1.0


def _beside_steps(
    engine: Any, prepare: Callable[[str, Path], Any], adapter_id: str, path: Path, clean_seconds: float
) -> TimedPrepare:
    span: dict[str, float] = {}
    result: dict[str, Any] = {}

    def run() -> None:
        limit_this_thread(1)
        span["start"] = time.perf_counter()
        result["copy"] = prepare(adapter_id, path)
        span["end"] = time.perf_counter()

    thread = threading.Thread(target=run, name="prepare-timer", daemon=True)
    steps: list[tuple[float, float]] = []
    thread.start()
    while thread.is_alive():
        steps.append(_timed_step(engine))
    thread.join()
    if "copy" not in result:
        raise RuntimeError(f"preparing {path} failed on the timing thread")
    start, end = span["start"], span["end"]
    within = tuple(
        seconds / clean_seconds for began, seconds in steps if began >= start and began + seconds <= end
    )
    return TimedPrepare(int(result["copy"].num_bytes), end - start, within)


def _timed_step(engine: Any) -> tuple[float, float]:
    """(start, seconds) of one engine step."""
    started = time.perf_counter()
    engine.step()
    return started, time.perf_counter() - started
