"""The event loop's lag: how late a timer set for `interval_s` fires, observed into lorahost_event_loop_lag_ms.

Every request and every streamed token of an API process runs on its one event loop, so a loop held up (a
callback that runs long, the GIL held by a thread) delays all of them by the same amount: this is that delay,
sampled `1 / interval_s` times a second by a task that costs a few microseconds per wake-up.
"""

from __future__ import annotations

import asyncio
import time

from api.metrics import ApiMetrics

DEFAULT_INTERVAL_S = 0.05


async def watch_loop_lag(metrics: ApiMetrics, interval_s: float = DEFAULT_INTERVAL_S) -> None:
    """Observe the loop's lag (ms) every `interval_s` until cancelled."""
    while True:
        due = time.perf_counter() + interval_s
        await asyncio.sleep(interval_s)
        metrics.loop_lag_ms.observe(max(0.0, (time.perf_counter() - due) * 1000))
