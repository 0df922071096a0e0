"""Adapter preparations timed beside a decoding batch (gpu_workers/engine/prepare_timer.py): one timing per
adapter and repeat, made on a helper thread limited as the preparer is, the batch gone afterwards; the
step factor is the median ratio, never below 1."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.prepare_timer import TimedPrepare, prepare_step_factor, time_prepares


def test_each_adapter_is_prepared_on_a_limited_thread_beside_a_batch_that_is_then_aborted(
    make_engine: Callable[..., LLMEngine], adapter_dirs: dict[str, Path]
) -> None:
    engine = make_engine()
    transfers = engine.runner.transfers
    seen: list[tuple[str, int, bool]] = []

    def prepare(adapter_id: str, path: Path) -> Any:
        is_helper = threading.current_thread() is not threading.main_thread()
        seen.append((adapter_id, torch.get_num_threads(), is_helper))
        return transfers.prepare_host_copy(adapter_id, path)

    paths = dict(enumerate(sorted(adapter_dirs.values())[:2]))
    timed = time_prepares(engine, prepare, paths, num_repeats=2)
    assert len(timed) == 4 and len({adapter_id for adapter_id, _, _ in seen}) == 4
    assert all(num_threads == 1 and is_helper for _, num_threads, is_helper in seen)
    assert all(t.num_bytes > 0 and t.seconds > 0 and all(r > 0 for r in t.step_ratios) for t in timed)
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("ratios", "factor"),
    [((), 1.0), ((0.5, 0.8), 1.0), ((3.0, 1.0, 2.0), 2.0), ((2.5,), 2.5)],
)
def test_the_step_factor_is_the_median_ratio_and_never_below_one(
    ratios: tuple[float, ...], factor: float
) -> None:
    timed = [TimedPrepare(1, 0.1, ratios[:1]), TimedPrepare(1, 0.1, ratios[1:])]
    assert prepare_step_factor(timed) == pytest.approx(factor)
