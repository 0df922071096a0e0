"""The engine's statistics: the typed `EngineStats` (scheduler/core/engine_stats.py) that `LLMEngine` returns
(what the worker's /stats and heartbeats are built from, `cluster.worker_stats.build_worker_stats`), with the
model runner's own part typed here (`RunnerStats`, its `Executor.stats`): adapter copies, host tier, LoRA
forms and kernels. `runner_part` narrows an `EngineStats`'s executor part to `RunnerStats` (what
`LLMEngine.runner_stats()` returns); readers use attributes, JSON writers `model_dump()`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pydantic import Field

from scheduler.core.engine_counters import RECENT_STEPS, EngineCounters, median_ms
from scheduler.core.engine_stats import EngineStats, ExecutorStats

if TYPE_CHECKING:
    from gpu_workers.engine.llm_engine import LLMEngine
    from gpu_workers.engine.model_runner import ModelRunner

__all__ = [
    "RECENT_STEPS",
    "EngineCounters",
    "RunnerStats",
    "engine_stats",
    "median_ms",
    "runner_part",
    "runner_stats",
]


class RunnerStats(ExecutorStats):
    """What the model runner measures itself (its `Executor.stats`)."""

    num_loaded_adapters: int = 0
    adapter_bytes: int = 0
    num_adapter_copies: int = 0
    num_host_tier_adapters: int = 0
    host_tier_bytes: int = 0
    num_host_tier_hits: int = 0
    num_host_tier_misses: int = 0
    adapter_copy_seconds_total: float = 0.0
    adapter_copy_seconds_max: float = 0.0
    num_lora_stack_builds: int = 0
    lora_stack_bytes: int = 0
    lora_kernel: bool = False
    cpu_kernels_compile_s: float | None = None  # None: loaded from the cache
    fp32_prefill_gemms: bool = False
    # op -> measured / cached / forced / only (ops with nothing to choose on this device are absent)
    kernel_choice_sources: dict[str, str] = Field(default_factory=dict)
    # op -> {form: why it was no candidate here} (e.g. the Triton LoRA forms on a CPU worker)
    kernel_choice_skipped: dict[str, dict[str, str]] = Field(default_factory=dict)
    # captured decode steps (gpu_workers/engine/decode_graphs.py): the buckets recorded at start, how long that
    # took, the graphs' device memory, decode steps replayed vs run eagerly, and why nothing is captured
    captured_batch_sizes: list[int] = Field(default_factory=list)
    graph_capture_s: float = 0.0
    graph_pool_bytes: int = 0
    num_graph_replays: int = 0
    num_eager_decode_steps: int = 0
    graphs_off_reason: str | None = None
    decode_step_compile_s: float | None = (
        None  # CPU: the compiled decode step's compile at start (None: eager)
    )
    dtype: str = ""
    device: str = ""


def engine_stats(engine: LLMEngine) -> EngineStats:
    """The engine core's stats with the model runner's part (module doc)."""
    return engine.core.stats()


def runner_part(stats: EngineStats) -> RunnerStats:
    """The model runner's part of `stats` (its `executor`), typed; TypeError if another executor made it."""
    if not isinstance(stats.executor, RunnerStats):
        raise TypeError(f"not the model runner's stats: {type(stats.executor).__name__}")
    return stats.executor


def runner_stats(runner: ModelRunner) -> RunnerStats:
    """What the model runner measures itself: device adapters and copies, host tier, LoRA forms, kernels."""
    transfers, graphs = runner.transfers, runner.decode_graphs
    return RunnerStats(
        num_loaded_adapters=len(runner.adapters),
        adapter_bytes=sum(a.num_bytes for a in runner.adapters.values()),
        num_adapter_copies=transfers.copier.num_copies,
        num_host_tier_adapters=len(transfers.host_tier),
        host_tier_bytes=transfers.host_tier.num_bytes,
        num_host_tier_hits=transfers.host_tier.num_hits,
        num_host_tier_misses=transfers.host_tier.num_misses,
        adapter_copy_seconds_total=transfers.copier.copy_seconds,
        adapter_copy_seconds_max=transfers.copier.max_copy_seconds,
        num_lora_stack_builds=runner.lora_forms.num_lora_stack_builds,
        lora_stack_bytes=runner.lora_forms.lora_stack_bytes(),
        lora_kernel=runner.lora_forms.use_lora_kernel,
        cpu_kernels_compile_s=runner.cpu_kernels_compile_s,
        fp32_prefill_gemms=runner.kernel_plan.prefill_gemm == "fp32_upcast",
        kernel_choices=dataclasses.asdict(
            runner.kernel_plan
        ),  # op -> form (gpu_workers/engine/kernel_plan.py)
        kernel_choice_sources={op: choice.source for op, choice in runner.kernel_tuner.choices.items()},
        kernel_choice_skipped={
            op: dict(choice.skipped) for op, choice in runner.kernel_tuner.choices.items() if choice.skipped
        },
        captured_batch_sizes=list(graphs.captured_sizes) if graphs else [],
        graph_capture_s=graphs.capture_seconds if graphs else 0.0,
        graph_pool_bytes=graphs.pool_bytes if graphs else 0,
        num_graph_replays=graphs.num_replays if graphs else 0,
        num_eager_decode_steps=graphs.num_eager_steps if graphs else 0,
        graphs_off_reason=runner.graphs_off_reason,
        decode_step_compile_s=runner.decode_step_compile_s,
        kernel_tuner_s=runner.kernel_tuner.seconds,  # 0 when every choice was cached or forced
        backend="native",
        max_lora_rank=runner.config.max_lora_rank,
        dtype=str(runner.dtype).replace("torch.", ""),
        device=str(runner.device),
    )
