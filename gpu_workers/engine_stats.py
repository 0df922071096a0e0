"""The engine's statistics: cumulative counters and the plain JSON-able dict `LLMEngine.stats()` returns
(what the worker's /stats, heartbeats, the router and the benchmarks read)."""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduler.fair_share import ANONYMOUS_TENANT, base_policy

if TYPE_CHECKING:
    from gpu_workers.engine import LLMEngine


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


RECENT_STEPS = 32


def median_ms(seconds: deque[float]) -> float | None:
    """Median of recent step durations in milliseconds (None before the first such step)."""
    return statistics.median(seconds) * 1000 if seconds else None


def routing_stats(engine: LLMEngine) -> dict[str, Any]:
    """What the rank-aware router reads: ranks of the registered, running and waiting requests' adapters (0 =
    base model), the queue's prompt tokens still to prefill, queued requests per size class (multiqueue
    policies) and per tenant (the router's fair-share load estimate, scheduler/router.py `tenant_load`) and the
    recent step times."""
    residency, scheduler, c = engine.residency, engine.scheduler, engine.counters
    ranks = residency.adapter_ranks()
    waiting = list(scheduler.waiting.values())
    return {
        "adapter_ranks": ranks,
        "running_ranks": [ranks.get(s.adapter_id, 0) if s.adapter_id else 0 for s in scheduler.running],
        "waiting_ranks": [ranks.get(s.adapter_id, 0) if s.adapter_id else 0 for s in waiting],
        "num_waiting_prompt_tokens": sum(max(0, s.num_prompt_tokens - s.num_computed_tokens) for s in waiting),
        "num_waiting_by_queue": _waiting_by_queue(engine, waiting),
        "num_waiting_by_tenant": _waiting_by_tenant(waiting),
        "decode_step_ms": median_ms(c.recent_decode_seconds),
        "prefill_step_ms": median_ms(c.recent_prefill_seconds),
    }


def _waiting_by_queue(engine: LLMEngine, waiting: list[Any]) -> list[int]:
    """Queued requests per size class when the batch policy has size-class queues (else [])."""
    policy = base_policy(engine.scheduler.policy)
    num_queues, queue_of = getattr(policy, "num_queues", None), getattr(policy, "queue_of", None)
    if not isinstance(num_queues, int) or queue_of is None:
        return []
    counts = [0] * num_queues
    for seq in waiting:
        index = queue_of(seq.request_id)
        if index is not None and 0 <= index < num_queues:
            counts[index] += 1
    return counts


def _waiting_by_tenant(waiting: list[Any]) -> dict[str, int]:
    """Queued requests per tenant id (requests without one under fair share's anonymous tenant, "")."""
    counts: dict[str, int] = {}
    for seq in waiting:
        tenant = ANONYMOUS_TENANT if seq.tenant_id is None else seq.tenant_id
        counts[tenant] = counts.get(tenant, 0) + 1
    return counts


def _adapter_cache_stats(engine: LLMEngine) -> dict[str, Any]:
    """Adapter cache counters: hits/misses at admission, loads (timed: copies planned by the core),
    evictions, prefetches, and how the page pool is split between KV, adapters and free pages."""
    residency, scheduler = engine.residency, engine.scheduler
    num_timed = residency.num_timed_loads
    return {
        "adapter_eviction_policy": residency.policy.name,
        "num_adapter_hits": scheduler.num_adapter_hits,
        "num_adapter_misses": scheduler.num_adapter_misses,
        "num_adapter_loads": residency.num_loads,
        "num_adapter_evictions": residency.num_evictions,
        "num_adapter_prefetches": scheduler.num_adapter_prefetches,
        "num_timed_adapter_loads": num_timed,
        "adapter_load_seconds_total": residency.load_seconds_total,
        "adapter_load_seconds_mean": residency.load_seconds_total / num_timed if num_timed else 0.0,
        "num_kv_pages_used": engine.pool.num_kv_pages,
        "num_adapter_pages": engine.pool.num_adapter_pages,
        "num_free_pool_pages": engine.pool.num_free_pages,
        "num_device_adapters": len(residency.device_adapters()),
        "num_host_adapters": residency.num_host_adapters(),
    }


def engine_stats(engine: LLMEngine) -> dict[str, Any]:
    """Counts, KV usage, adapter cache counters and step timings (plain JSON-able values)."""
    c = engine.counters
    cache = engine.prefix_cache
    return {
        **_adapter_cache_stats(engine),
        **routing_stats(engine),
        "num_waiting": len(engine.scheduler.waiting),
        "num_running": len(engine.scheduler.running),
        "num_finished": c.num_finished,
        "num_aborted": c.num_aborted,
        "num_preemptions": engine.scheduler.num_preemptions,
        "num_steps": c.num_steps,
        "num_prompt_tokens": c.num_prompt_tokens,
        "num_output_tokens": c.num_output_tokens,
        "num_batched_tokens": c.num_batched_tokens,
        "step_seconds_total": c.step_seconds,
        "step_seconds_mean": c.step_seconds / c.num_steps if c.num_steps else 0.0,
        "step_seconds_max": c.max_step_seconds,
        "num_kv_blocks": engine.pool.num_blocks,
        "num_free_kv_blocks": engine.scheduler.num_reclaimable_blocks(),  # free + unreferenced cached
        "num_cached_blocks": cache.num_cached_blocks if cache is not None else 0,
        "num_prefix_cache_hit_tokens": cache.num_hit_tokens if cache is not None else 0,
        "num_prefix_cache_query_tokens": cache.num_query_tokens if cache is not None else 0,
        "num_pool_pages": engine.pool.num_pages,
        "memory_mode": engine.config.memory_mode,
        "num_loaded_adapters": len(engine.runner.adapters),
        "adapter_bytes": sum(a.num_bytes for a in engine.runner.adapters.values()),
        "device_adapters": engine.residency.device_adapters(),
        "num_adapter_load_failures": engine.counters.num_adapter_load_failures,
        "num_cpu_assisted_prefills": engine.scheduler.num_cpu_assisted_prefills,
        "num_copy_waits": engine.scheduler.num_copy_waits,
        "num_adapter_copies": engine.runner.transfers.copier.num_copies,
        "num_adapter_copy_failures": c.num_adapter_copy_failures,
        "num_host_tier_adapters": len(engine.runner.transfers.host_tier),
        "host_tier_bytes": engine.runner.transfers.host_tier.num_bytes,
        "num_host_tier_hits": engine.runner.transfers.host_tier.num_hits,
        "num_host_tier_misses": engine.runner.transfers.host_tier.num_misses,
        "adapter_copy_seconds_total": engine.runner.transfers.copier.copy_seconds,
        "adapter_copy_seconds_max": engine.runner.transfers.copier.max_copy_seconds,
        "num_lora_stack_builds": engine.runner.lora_forms.num_lora_stack_builds,
        "lora_stack_bytes": engine.runner.lora_forms.lora_stack_bytes(),
        "lora_kernel": engine.runner.lora_forms.use_lora_kernel,
        "cpu_kernels_compile_s": engine.runner.cpu_kernels_compile_s,  # None: loaded from the cache
        "fp32_prefill_gemms": engine.runner.kernel_plan.prefill_gemm == "fp32_upcast",
        "kernel_choices": dataclasses.asdict(engine.runner.kernel_plan),  # op -> form (gpu_workers/kernel_plan.py)
        # op -> measured / cached / forced / only (ops with nothing to choose on this device are absent)
        "kernel_choice_sources": {op: c.source for op, c in engine.runner.kernel_tuner.choices.items()},
        "kernel_tuner_s": engine.runner.kernel_tuner.seconds,  # 0 when every choice was cached or forced
        "max_model_len": engine.max_model_len,
        "dtype": str(engine.runner.dtype).replace("torch.", ""),
        "device": str(engine.runner.device),
    }
