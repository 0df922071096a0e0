"""The engine's statistics: cumulative counters and the plain JSON-able dict `LLMEngine.stats()` returns
(what the worker's /stats, heartbeats, the router and the benchmarks read).

The dict is the core's `SchedulerStats` (scheduler/core/scheduler_stats.py, in its JSON form) plus what the
engine itself measures: step counts and timings, the model runner's adapter copies, host tier and kernels.
The worker reads it into `cluster.protocol.WorkerStats` by key, so the keys shared with WorkerStats are
its field names.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_workers.engine.llm_engine import LLMEngine
    from scheduler.core.sequence import BatchEntry


@dataclass
class EngineCounters:
    """Cumulative counters reported by `stats()`."""

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


RECENT_STEPS = 32


def median_ms(seconds: deque[float]) -> float | None:
    """Median of recent step durations in milliseconds (None before the first such step)."""
    return statistics.median(seconds) * 1000 if seconds else None


def engine_stats(engine: LLMEngine) -> dict[str, Any]:
    """The core's stats plus counts, KV usage, adapter copies and step timings (plain JSON-able values)."""
    c = engine.counters
    core = engine.scheduler.make_stats()
    runner = engine.runner
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
        "memory_mode": engine.config.memory_mode,
        "num_loaded_adapters": len(runner.adapters),
        "adapter_bytes": sum(a.num_bytes for a in runner.adapters.values()),
        "num_adapter_load_failures": c.num_adapter_load_failures,
        "num_adapter_copies": runner.transfers.copier.num_copies,
        "num_adapter_copy_failures": c.num_adapter_copy_failures,
        "num_host_tier_adapters": len(runner.transfers.host_tier),
        "host_tier_bytes": runner.transfers.host_tier.num_bytes,
        "num_host_tier_hits": runner.transfers.host_tier.num_hits,
        "num_host_tier_misses": runner.transfers.host_tier.num_misses,
        "adapter_copy_seconds_total": runner.transfers.copier.copy_seconds,
        "adapter_copy_seconds_max": runner.transfers.copier.max_copy_seconds,
        "num_lora_stack_builds": runner.lora_forms.num_lora_stack_builds,
        "lora_stack_bytes": runner.lora_forms.lora_stack_bytes(),
        "lora_kernel": runner.lora_forms.use_lora_kernel,
        "cpu_kernels_compile_s": runner.cpu_kernels_compile_s,  # None: loaded from the cache
        "fp32_prefill_gemms": runner.kernel_plan.prefill_gemm == "fp32_upcast",
        "kernel_choices": dataclasses.asdict(
            runner.kernel_plan
        ),  # op -> form (gpu_workers/engine/kernel_plan.py)
        # op -> measured / cached / forced / only (ops with nothing to choose on this device are absent)
        "kernel_choice_sources": {op: choice.source for op, choice in runner.kernel_tuner.choices.items()},
        "kernel_tuner_s": runner.kernel_tuner.seconds,  # 0 when every choice was cached or forced
        "max_model_len": engine.max_model_len,
        "dtype": str(runner.dtype).replace("torch.", ""),
        "device": str(runner.device),
    }
