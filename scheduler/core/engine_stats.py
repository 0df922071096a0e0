"""The engine's typed statistics: what `EngineCore.stats()` returns (vLLM v1's `SchedulerStats` plus its
iteration stats, one typed value instead of a dict read by key).

`EngineStats` is the scheduler's `SchedulerStats` (queues, pages, residency, the router's inputs), the core's
cumulative counters and recent step timings (`EngineCounters`), the memory geometry, and the executor's own
measurements as a typed `ExecutorStats` (each executor extends it: the model runner's `RunnerStats`,
gpu_workers/engine/engine_stats.py; the twin's `SimulatedExecutorStats`; the vLLM backend's `VllmStats`).
The worker and the twin turn it into the published `cluster.protocol.WorkerStats` with the one conversion
`cluster.worker_stats.build_worker_stats` (its SchedulerStats fields nested as `scheduler`; the executor's
`ExecutorStats` fields and the step timings as `engine`, an `EngineSummary`). Readers use its attributes (the executor's part narrowed with
isinstance, e.g. `gpu_workers.engine.engine_stats.runner_part`); `to_dict` is its one flat JSON export, for
where JSON is written (benchmarks/peers/lorahost_engine.py), never read back by key.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny

from scheduler.core.engine_counters import EngineCounters, median_ms
from scheduler.core.scheduler_stats import SchedulerStats


class ExecutorStats(BaseModel):
    """What an executor measures itself; the fields every executor may publish (defaults: not measured)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = "native"  # the engine behind the worker (settings engine.backend: native or vllm)
    max_lora_rank: int = 0  # the largest adapter rank it serves (0: not published)
    # op -> implementation the kernel tuner chose (gpu_workers/engine/kernel_plan.py), and the tuning's cost
    kernel_choices: dict[str, str] = Field(default_factory=dict)
    kernel_tuner_s: float = 0.0


class EngineStats(SchedulerStats):
    """The engine's state and counters now (module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_kv_blocks: int = 0  # = num_total_kv_blocks (the name benchmarks and profilers read)
    adapter_load_seconds_mean: float = 0.0
    decode_step_ms: float | None = None  # median of the recent decode-only steps (None: none yet)
    prefill_step_ms: float | None = None  # median of the recent steps with prefill tokens
    num_finished: int = 0
    num_aborted: int = 0
    num_steps: int = 0
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_batched_tokens: int = 0
    step_seconds_total: float = 0.0
    step_seconds_mean: float = 0.0
    step_seconds_max: float = 0.0
    num_adapter_load_failures: int = 0  # planned or explicit loads to the device that failed
    num_adapter_copy_failures: int = 0  # planned (asynchronous) copies that failed
    num_adapter_prepare_failures: int = 0  # planned loads whose host copy could not be made
    # host copies read, validated and packed off the step loop (the executor's preparer; not host tier hits)
    num_adapter_preparations: int = 0
    adapter_prepare_seconds_total: float = 0.0
    adapter_prepare_seconds_max: float = 0.0
    # step plans that moved KV pages out of an adapter load's run, and the pages moved (unified pool)
    num_compactions: int = 0
    num_kv_block_moves: int = 0
    # memory geometry
    memory_mode: str = ""
    max_model_len: int = 0
    executor: SerializeAsAny[ExecutorStats] = Field(default_factory=ExecutorStats)

    def to_dict(self, mode: Literal["json", "python"] = "json") -> dict[str, Any]:
        """The flat JSON export: the core's fields, then the fields the executor set (write it, don't read it)."""
        return {
            **self.model_dump(mode=mode, exclude={"executor"}),
            **self.executor.model_dump(mode=mode, exclude_unset=True),
        }


def engine_stats(
    scheduler: SchedulerStats,
    counters: EngineCounters,
    executor: ExecutorStats,
    *,
    memory_mode: str,
    max_model_len: int,
) -> EngineStats:
    """The scheduler's stats plus the core's counts and step timings, the geometry and the executor's part."""
    c = counters
    return EngineStats(
        **scheduler.__dict__,  # its fields (dict(model) iterates through pydantic, several times slower)
        num_kv_blocks=scheduler.num_total_kv_blocks,
        adapter_load_seconds_mean=(
            scheduler.adapter_load_seconds_total / scheduler.num_timed_adapter_loads
            if scheduler.num_timed_adapter_loads
            else 0.0
        ),
        decode_step_ms=median_ms(c.recent_decode_seconds),
        prefill_step_ms=median_ms(c.recent_prefill_seconds),
        num_finished=c.num_finished,
        num_aborted=c.num_aborted,
        num_steps=c.num_steps,
        num_prompt_tokens=c.num_prompt_tokens,
        num_output_tokens=c.num_output_tokens,
        num_batched_tokens=c.num_batched_tokens,
        step_seconds_total=c.step_seconds,
        step_seconds_mean=c.step_seconds / c.num_steps if c.num_steps else 0.0,
        step_seconds_max=c.max_step_seconds,
        num_adapter_load_failures=c.num_adapter_load_failures,
        num_adapter_copy_failures=c.num_adapter_copy_failures,
        num_adapter_prepare_failures=c.num_adapter_prepare_failures,
        num_adapter_preparations=c.num_adapter_preparations,
        adapter_prepare_seconds_total=c.adapter_prepare_seconds,
        adapter_prepare_seconds_max=c.max_adapter_prepare_seconds,
        num_compactions=c.num_compactions,
        num_kv_block_moves=c.num_kv_block_moves,
        memory_mode=memory_mode,
        max_model_len=max_model_len,
        executor=executor,
    )
