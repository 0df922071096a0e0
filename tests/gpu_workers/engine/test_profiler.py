"""The router's samples are read off the one measuring pass (gpu_workers/engine/grid_timer.py)."""

from __future__ import annotations

from gpu_workers.engine.grid_timer import TimedBatch, TimedStep
from gpu_workers.engine.profile_grid import ProfileGrid
from gpu_workers.engine.profiler import router_samples
from scheduler.routing.perf_model import LatencySample
from twin.step_shape import StepShape


def _batch(num_tokens: int, ranks: tuple[int, ...] | None, *ms: float) -> TimedBatch:
    return TimedBatch(num_tokens, ranks, tuple(TimedStep(StepShape(), m / 1000, 0.0) for m in ms))


def test_router_samples_keep_each_points_best_prefill_and_decode_in_grid_order() -> None:
    grid = ProfileGrid(ranks=(8,), batch_sizes=(1,), prompt_tokens=(16,), num_decode_steps=2, num_repeats=2)
    batches = [
        _batch(16, (0,), 10.0, 3.0, 4.0),
        _batch(16, (8,), 12.0, 5.0, 6.0),
        _batch(16, None, 1.0, 1.0, 1.0),  # a twin-only batch (distinct adapters): not a router sample
        _batch(16, (0,), 9.0, 3.5, 2.5, 0.5),  # 2nd repeat; its 4th step is the twin's mixed step
        _batch(16, (8,), 13.0, 4.5, 7.0),
    ]
    prefill, decode = router_samples(batches, grid)
    assert prefill == [LatencySample(((16, 0),), 9.0), LatencySample(((16, 8),), 12.0)]
    assert decode == [LatencySample(((1, 0),), 2.5), LatencySample(((1, 8),), 4.5)]
