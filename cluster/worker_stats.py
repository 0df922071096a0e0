"""The one conversion from an engine's typed stats plus the worker's own state to the published
`WorkerStats` (what /stats answers and heartbeats carry), called by the worker
(gpu_workers/worker/worker_service.py) and by the twin's simulated worker (twin/cluster_node.py).

Pure. Every engine field is either published (a field of the same name in one of WorkerStats' engine parts,
`WorkerStats.scheduler` (SchedulerStats) or `WorkerStats.engine` (EngineSummary), copied here) or named in
`UNPUBLISHED_ENGINE_FIELDS` (local diagnostics: `LLMEngine.engine_stats()` and the benchmarks read them), so
no field is dropped silently; tests/cluster/test_worker_stats.py holds the engine, WorkerStats, the router's
`WorkerView` and the console's reads against each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.protocol import EngineSummary, WorkerStats
from scheduler.core.engine_stats import EngineStats, ExecutorStats
from scheduler.core.scheduler_stats import SchedulerStats

# Engine fields the worker does not publish (diagnostics read off the engine itself), by where they come from.
UNPUBLISHED_ENGINE_FIELDS = frozenset(
    {
        # the core's cumulative counters, step timings and geometry (EngineStats)
        "num_kv_blocks",
        "adapter_load_seconds_mean",
        "num_finished",
        "num_aborted",
        "num_steps",
        "num_prompt_tokens",
        "num_output_tokens",
        "num_batched_tokens",
        "step_seconds_total",
        "step_seconds_mean",
        "step_seconds_max",
        "num_adapter_load_failures",  # published summed into WorkerStats.num_load_failures
        "num_adapter_copy_failures",
        "num_adapter_prepare_failures",
        "num_adapter_preparations",
        "adapter_prepare_seconds_total",
        "adapter_prepare_seconds_max",
        "num_compactions",
        "num_kv_block_moves",
        "memory_mode",
        "max_model_len",
        "executor",  # published as WorkerStats.engine (EngineSummary): ExecutorStats' own fields
        # the model runner's (gpu_workers/engine/engine_stats.py RunnerStats)
        "num_loaded_adapters",
        "adapter_bytes",
        "num_adapter_copies",
        "num_host_tier_adapters",
        "host_tier_bytes",
        "num_host_tier_hits",
        "num_host_tier_misses",
        "adapter_copy_seconds_total",
        "adapter_copy_seconds_max",
        "num_lora_stack_builds",
        "lora_stack_bytes",
        "lora_kernel",
        "cpu_kernels_compile_s",
        "fp32_prefill_gemms",
        "kernel_choice_sources",
        "kernel_choice_skipped",
        "captured_batch_sizes",
        "graph_capture_s",
        "graph_pool_bytes",
        "num_graph_replays",
        "num_eager_decode_steps",
        "graphs_off_reason",
        "decode_step_compile_s",
        "dtype",
        "device",
        # the twin's simulated executor (twin/simulated_executor.py SimulatedExecutorStats)
        "busy_seconds",
        # the vLLM backend's (gpu_workers/worker/vllm_backend.py VllmStats)
        "max_loras",
        "is_base_on_zero_adapter",
    }
)


@dataclass(frozen=True)
class WorkerState:
    """What the worker process adds around its engine: identity, host cache, requests in flight, counters."""

    worker_id: str
    base_model: str
    max_num_seqs: int
    host_adapters: Sequence[str] = ()  # host-cached adapter files not on the device
    known_ranks: Mapping[str, int] = field(default_factory=dict)  # host-cached adapters' ranks (the API's)
    num_active: int = 0
    num_cache_hits: int = 0
    num_cache_misses: int = 0
    num_adapter_unloads: int = 0
    num_load_failures: int = 0  # fetch, verification and registration failures (the engine adds its copies')
    perf_model: dict[str, Any] | None = None
    is_ready: bool = True
    is_draining: bool = False


def build_worker_stats(engine: EngineStats, worker: WorkerState) -> WorkerStats:
    """The published state of a worker whose engine reports `engine` (module doc). Merged: the worker's load
    failures and the engine's failed copies in `num_load_failures`; the host cache's known ranks and the
    engine's registered adapters' in `scheduler.adapter_ranks` (the engine's rank wins)."""
    return WorkerStats(
        worker_id=worker.worker_id,
        base_model=worker.base_model,
        max_num_seqs=worker.max_num_seqs,
        host_adapters=tuple(worker.host_adapters),
        num_active=worker.num_active,
        num_cache_hits=worker.num_cache_hits,
        num_cache_misses=worker.num_cache_misses,
        num_adapter_unloads=worker.num_adapter_unloads,
        num_load_failures=worker.num_load_failures + engine.num_adapter_load_failures,
        perf_model=worker.perf_model,
        is_ready=worker.is_ready and not worker.is_draining,
        is_draining=worker.is_draining,
        scheduler=_scheduler_part(engine, adapter_ranks={**worker.known_ranks, **engine.adapter_ranks}),
        engine=_engine_part(engine),
    )


def _scheduler_part(engine: EngineStats, **merged: Any) -> SchedulerStats:
    """The engine core's `SchedulerStats` fields of `engine`, with the worker's merged values."""
    return SchedulerStats(
        **{**{name: getattr(engine, name) for name in SchedulerStats.model_fields}, **merged}
    )


def _engine_part(engine: EngineStats) -> EngineSummary:
    """The executor's common fields (whatever executor measured them) and the core's step timings."""
    common = {name: getattr(engine.executor, name) for name in ExecutorStats.model_fields}
    return EngineSummary(
        **common, decode_step_ms=engine.decode_step_ms, prefill_step_ms=engine.prefill_step_ms
    )
