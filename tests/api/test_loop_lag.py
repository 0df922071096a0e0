"""The event loop's lag (api/loop_lag.py): a loop held up shows in lorahost_event_loop_lag_ms."""

from __future__ import annotations

import asyncio
import time

from api.loop_lag import watch_loop_lag
from api.metrics import ApiMetrics


def _observations(metrics: ApiMetrics, min_ms: float) -> float:
    """How many observations were at least `min_ms` (from the histogram's buckets)."""
    total = at_most = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "lorahost_event_loop_lag_ms_count":
                total = sample.value
            if sample.name == "lorahost_event_loop_lag_ms_bucket" and float(sample.labels["le"]) == min_ms:
                at_most = sample.value
    return total - at_most


def _hold_the_loop(seconds: float) -> None:
    """A callback that runs long: nothing else on the loop runs meanwhile."""
    time.sleep(seconds)


def test_a_blocked_loop_is_observed_as_lag() -> None:
    metrics = ApiMetrics()

    async def run() -> float:
        watch = asyncio.create_task(watch_loop_lag(metrics, interval_s=0.01))
        await asyncio.sleep(0)  # the watcher has set its first timer
        _hold_the_loop(0.3)  # the watcher's timer fires late
        deadline = time.monotonic() + 10
        while _observations(metrics, 200) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        watch.cancel()
        return _observations(metrics, 200)

    assert asyncio.run(run()) >= 1  # the timer due during the block fired at least 200 ms late
