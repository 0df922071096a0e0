"""The engine core's cumulative counters and recent step timings, and the core's part of the engine stats
dict (`core_stats`): the scheduler's `SchedulerStats` (scheduler/core/scheduler_stats.py, in its JSON form)
plus step counts and timings. The executor adds what it measures itself (`Executor.stats`); the worker reads
the whole dict into `cluster.protocol.WorkerStats` by key, so the keys shared with WorkerStats are its field
names."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.scheduler_stats import SchedulerStats
from scheduler.core.sequence import BatchEntry

RECENT_STEPS = 32


@dataclass
class EngineCounters:
    """Cumulative counters reported by the engine's stats."""

    num_steps: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_batched_tokens: int = 0
    step_seconds: float = 0.0
    max_step_seconds: float = 0.0
    num_adapter_load_failures: int = 0  # planned or explicit copies to the device that failed
    num_adapter_copy_failures: int = 0  # planned (asynchronous) copies that failed
    # the last RECENT_STEPS step durations (seconds): decode-only steps, and steps with prefill tokens
    recent_decode_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    recent_prefill_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))

    def record_step(self, entries: list[BatchEntry], num_sampled: int, seconds: float) -> None:
        """Count one executed step of `entries` that sampled `num_sampled` tokens in `seconds`."""
        self.num_steps += 1
        self.num_batched_tokens += sum(e.num_new_tokens for e in entries)
        self.num_output_tokens += num_sampled
        self.step_seconds += seconds
        self.max_step_seconds = max(self.max_step_seconds, seconds)
        is_decode = all(
            e.seq.num_computed_tokens - e.num_new_tokens >= e.seq.num_prompt_tokens for e in entries
        )
        (self.recent_decode_seconds if is_decode else self.recent_prefill_seconds).append(seconds)


def median_ms(seconds: deque[float]) -> float | None:
    """Median of recent step durations in milliseconds (None before the first such step)."""
    return statistics.median(seconds) * 1000 if seconds else None


def core_stats(core: SchedulerStats, c: EngineCounters) -> dict[str, Any]:
    """The scheduler's stats plus counts and step timings (plain JSON-able values)."""
    return {
        **core.model_dump(mode="json"),
        "num_kv_blocks": core.num_total_kv_blocks,
        "adapter_load_seconds_mean": (
            core.adapter_load_seconds_total / core.num_timed_adapter_loads
            if core.num_timed_adapter_loads
            else 0.0
        ),
        "decode_step_ms": median_ms(c.recent_decode_seconds),
        "prefill_step_ms": median_ms(c.recent_prefill_seconds),
        "num_finished": c.num_finished,
        "num_aborted": c.num_aborted,
        "num_steps": c.num_steps,
        "num_prompt_tokens": c.num_prompt_tokens,
        "num_output_tokens": c.num_output_tokens,
        "num_batched_tokens": c.num_batched_tokens,
        "step_seconds_total": c.step_seconds,
        "step_seconds_mean": c.step_seconds / c.num_steps if c.num_steps else 0.0,
        "step_seconds_max": c.max_step_seconds,
        "num_adapter_load_failures": c.num_adapter_load_failures,
        "num_adapter_copy_failures": c.num_adapter_copy_failures,
    }
