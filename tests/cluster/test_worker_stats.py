"""The engine's stats, the published WorkerStats and what the router and the console read, held against each
other: no engine field is dropped silently at the worker boundary (cluster/worker_stats.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.membership import WorkerRecord
from cluster.protocol import WorkerStats
from cluster.worker_stats import UNPUBLISHED_ENGINE_FIELDS, WorkerState, build_worker_stats
from gpu_workers.engine.engine_stats import RunnerStats
from gpu_workers.worker.vllm_backend import VllmStats
from scheduler.core.engine_stats import EngineStats, ExecutorStats
from scheduler.routing.router import WorkerView
from twin.simulated_executor import SimulatedExecutorStats

EXECUTORS = (RunnerStats, SimulatedExecutorStats, VllmStats)
# WorkerStats fields the console pages and /metrics read (api/console/residency.py, api/metrics.py)
CONSOLE_READS = frozenset(
    {
        "worker_id", "base_model", "engine", "device_adapters", "host_adapters", "num_running", "num_waiting",
        "num_running_by_adapter", "num_waiting_by_adapter", "num_kv_pages_used", "num_adapter_pages",
        "num_free_pool_pages", "num_adapter_hits", "num_adapter_misses", "num_adapter_prefetches",
        "num_adapter_loads", "num_adapter_evictions", "num_timed_adapter_loads", "adapter_load_seconds_total",
        "adapter_num_loads", "adapter_load_seconds", "num_copy_waits", "num_cpu_assisted_prefills",
        "num_cache_hits", "num_cache_misses",
    }
)  # fmt: skip


def engine_fields() -> set[str]:
    """Every field an engine produces: the core's and each executor's."""
    fields = set(EngineStats.model_fields)
    for executor in EXECUTORS:
        fields |= set(executor.model_fields)
    return fields


def test_every_engine_field_is_published_or_named_unpublished() -> None:
    published = set(WorkerStats.model_fields)
    assert engine_fields() - published == UNPUBLISHED_ENGINE_FIELDS
    assert not UNPUBLISHED_ENGINE_FIELDS & published


def test_what_the_router_and_the_console_read_is_published() -> None:
    published = set(WorkerStats.model_fields)
    assert {f for f in WorkerView.__dataclass_fields__} <= published
    assert CONSOLE_READS <= published


def test_worker_stats_refuse_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        WorkerStats(worker_id="w", base_model="b", num_adapter_copies=3)  # type: ignore[call-arg]


def test_a_stored_record_drops_a_newer_workers_fields_explicitly() -> None:
    stored = (
        WorkerRecord("w", "http://w", "b", num_running=2).to_json().replace("{", '{"a_newer_field": 1, ', 1)
    )
    assert WorkerRecord.from_json(stored).num_running == 2


def test_build_worker_stats_publishes_the_engine_and_the_workers_parts() -> None:
    engine = EngineStats(
        num_running=2,
        device_adapters=("a",),
        adapter_ranks={"a": 8},
        decode_step_ms=4.0,
        num_adapter_load_failures=1,
        executor=ExecutorStats(
            engine="vllm", max_lora_rank=64, kernel_choices={"op": "x"}, kernel_tuner_s=0.5
        ),
    )
    worker = WorkerState(
        worker_id="w",
        base_model="b",
        max_num_seqs=4,
        host_adapters=("h",),
        known_ranks={"h": 16},
        num_load_failures=2,
        is_draining=True,
    )
    stats = build_worker_stats(engine, worker)
    assert (stats.num_running, stats.device_adapters, stats.host_adapters) == (2, ("a",), ("h",))
    assert stats.adapter_ranks == {"h": 16, "a": 8} and stats.decode_step_ms == 4.0
    assert (stats.engine, stats.max_lora_rank, stats.kernel_choices, stats.kernel_tuner_s) == (
        "vllm",
        64,
        {"op": "x"},
        0.5,
    )
    assert stats.num_load_failures == 3 and not stats.is_ready and stats.is_draining
