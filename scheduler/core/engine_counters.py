"""The engine core's cumulative counters and recent step timings (read into the typed `EngineStats`,
scheduler/core/engine_stats.py)."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

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
    num_adapter_load_failures: int = 0  # planned or explicit loads to the device that failed
    num_adapter_copy_failures: int = 0  # planned (asynchronous) copies that failed
    num_adapter_prepare_failures: int = 0  # planned loads whose host copy could not be made (bad files)
    # host copies read, validated and packed off the step loop (host tier hits are not counted)
    num_adapter_preparations: int = 0
    adapter_prepare_seconds: float = 0.0
    max_adapter_prepare_seconds: float = 0.0
    # plans that moved KV pages out of an adapter load's run (PagePool.reserve_moving), and the pages moved
    num_compactions: int = 0
    num_kv_block_moves: int = 0
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

    def record_decode_steps(self, num_rows: int, seconds: list[float]) -> None:
        """Count decode-only steps of `num_rows` rows each, one per duration in `seconds` (a multi-step
        window's steps run at once: what `record_step` counts for each of them)."""
        total = self.step_seconds
        for step_seconds in seconds:  # added one by one, as one record_step per step adds them
            total += step_seconds
        self.step_seconds = total
        self.num_steps += len(seconds)
        self.num_batched_tokens += num_rows * len(seconds)
        self.num_output_tokens += num_rows * len(seconds)
        self.max_step_seconds = max(self.max_step_seconds, max(seconds, default=0.0))
        self.recent_decode_seconds.extend(seconds)

    def record_kv_block_moves(self, num_moves: int) -> None:
        """Count one step plan's copies of `num_moves` KV pages moved out of adapter runs."""
        self.num_compactions += 1
        self.num_kv_block_moves += num_moves

    def record_preparation(self, seconds: float) -> None:
        """Count one host copy prepared off the step loop in `seconds`."""
        self.num_adapter_preparations += 1
        self.adapter_prepare_seconds += seconds
        self.max_adapter_prepare_seconds = max(self.max_adapter_prepare_seconds, seconds)


def median_ms(seconds: deque[float]) -> float | None:
    """Median of recent step durations in milliseconds (None before the first such step)."""
    return statistics.median(seconds) * 1000 if seconds else None
