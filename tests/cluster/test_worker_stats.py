"""The engine's stats, the published WorkerStats and what the router and the console read, held against each
other: no engine field is dropped silently at the worker boundary (cluster/worker_stats.py), and the
published nested shape parses back whatever executor measured it."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from cluster.membership import WorkerRecord
from cluster.protocol import EngineSummary, WorkerStats
from cluster.worker_stats import UNPUBLISHED_ENGINE_FIELDS, WorkerState, build_worker_stats
from gpu_workers.engine.engine_stats import RunnerStats
from gpu_workers.worker.vllm_backend import VllmStats
from scheduler.core.engine_stats import EngineStats, ExecutorStats
from scheduler.core.scheduler_stats import SchedulerStats
from twin.simulated_executor import SimulatedExecutorStats

EXECUTORS = (RunnerStats, SimulatedExecutorStats, VllmStats)
ENGINE_PARTS = ("scheduler", "engine")  # WorkerStats' parts filled from the engine's stats
# What the console pages and /metrics read of a WorkerStats (api/console/ops_routes.py, residency.py,
# templates/admin_workers.html, api/metrics.py), as attribute paths
CONSOLE_READS = frozenset(
    {
        "worker_id", "base_model", "engine.backend", "is_ready", "is_draining", "host_adapters",
        "num_cache_hits", "num_cache_misses", "engine.decode_step_ms", "engine.prefill_step_ms",
        "scheduler.device_adapters", "scheduler.num_running", "scheduler.num_waiting",
        "scheduler.num_waiting_by_queue", "scheduler.num_running_by_adapter", "scheduler.num_waiting_by_adapter",
        "scheduler.num_kv_pages_used", "scheduler.num_adapter_pages", "scheduler.num_free_pool_pages",
        "scheduler.num_pool_pages", "scheduler.num_adapter_hits", "scheduler.num_adapter_misses",
        "scheduler.num_adapter_prefetches", "scheduler.num_adapter_loads", "scheduler.num_adapter_evictions",
        "scheduler.num_timed_adapter_loads", "scheduler.adapter_load_seconds_total",
        "scheduler.adapter_num_loads", "scheduler.adapter_load_seconds", "scheduler.num_copy_waits",
        "scheduler.num_cpu_assisted_prefills",
    }
)  # fmt: skip


def part_model(name: str) -> type[BaseModel]:
    """The model class of one of WorkerStats' nested parts, as WorkerStats declares it."""
    annotation = WorkerStats.model_fields[name].annotation
    assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation


def engine_fields() -> set[str]:
    """Every field an engine produces: the core's and each executor's."""
    fields = set(EngineStats.model_fields)
    for executor in EXECUTORS:
        fields |= set(executor.model_fields)
    return fields


def published_engine_fields() -> set[str]:
    """The fields of WorkerStats' engine parts."""
    return {name for part in ENGINE_PARTS for name in part_model(part).model_fields}


def resolves(model: type[BaseModel], path: str) -> bool:
    """True when the attribute path `path` (`scheduler.num_running`) names a field of `model`."""
    head, _, rest = path.partition(".")
    field = model.model_fields.get(head)
    if field is None:
        return False
    if not rest:
        return True
    annotation = field.annotation
    return isinstance(annotation, type) and issubclass(annotation, BaseModel) and resolves(annotation, rest)


def test_every_engine_field_is_published_or_named_unpublished() -> None:
    published = published_engine_fields()
    assert engine_fields() - published == UNPUBLISHED_ENGINE_FIELDS
    assert not UNPUBLISHED_ENGINE_FIELDS & published
    assert published <= engine_fields()  # every published engine field comes from the engine


def test_the_engine_parts_are_the_cores_stats_and_the_executors_common_fields_with_step_timings() -> None:
    assert part_model("scheduler") is SchedulerStats and part_model("engine") is EngineSummary
    assert set(EngineSummary.model_fields) == set(ExecutorStats.model_fields) | {
        "decode_step_ms",
        "prefill_step_ms",
    }


def test_what_the_console_reads_is_published() -> None:
    assert [path for path in sorted(CONSOLE_READS) if not resolves(WorkerStats, path)] == []


def test_worker_stats_refuse_unknown_fields_in_every_part() -> None:
    with pytest.raises(ValidationError):
        WorkerStats(worker_id="w", base_model="b", num_adapter_copies=3)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        WorkerStats.model_validate(
            {"worker_id": "w", "base_model": "b", "scheduler": {"num_adapter_copies": 3}}
        )
    with pytest.raises(ValidationError):
        WorkerStats.model_validate({"worker_id": "w", "base_model": "b", "engine": {"device": "cpu"}})


def test_a_stored_record_drops_a_newer_workers_fields_explicitly() -> None:
    record = WorkerRecord("w", "http://w", "b", scheduler=SchedulerStats(num_running=2))
    stored = record.to_json().replace('"scheduler": {', '"scheduler": {"a_newer_field": 1, ', 1)
    stored = stored.replace("{", '{"a_newer_field": 1, ', 1)
    assert WorkerRecord.from_json(stored) == record


@pytest.mark.parametrize(
    "executor",
    [
        RunnerStats(kernel_choices={"op": "x"}, max_lora_rank=16, num_adapter_copies=4, device="cpu"),
        SimulatedExecutorStats(max_lora_rank=64, busy_seconds=2.0),
        VllmStats(backend="vllm", max_lora_rank=32, max_loras=4),
    ],
)
def test_published_stats_parse_back_whatever_executor_measured_them(executor: ExecutorStats) -> None:
    engine = EngineStats(num_running=1, decode_step_ms=3.0, executor=executor)
    stats = build_worker_stats(engine, WorkerState("w", "b", max_num_seqs=2))
    assert type(stats.engine) is EngineSummary and stats.engine.max_lora_rank == executor.max_lora_rank
    assert WorkerStats.model_validate_json(stats.model_dump_json()) == stats
    record = WorkerRecord.from_stats(stats, "http://w")
    assert WorkerRecord.from_json(record.to_json()) == record


def test_build_worker_stats_copies_every_field_of_the_engine_parts() -> None:
    engine = EngineStats(
        num_running=2,
        num_waiting=1,
        num_free_pool_pages=7,
        device_adapters=("a",),
        adapter_ranks={"a": 8},
        running_ranks=(8, 0),
        num_waiting_by_tenant={"t": 1},
        adapter_num_loads={"a": 2},
        decode_step_ms=4.0,
        prefill_step_ms=9.0,
        executor=RunnerStats(max_lora_rank=16, kernel_choices={"op": "x"}, kernel_tuner_s=0.5),
    )
    stats = build_worker_stats(engine, WorkerState("w", "b", max_num_seqs=4))
    for name in SchedulerStats.model_fields:
        assert getattr(stats.scheduler, name) == getattr(engine, name), name
    for name in ExecutorStats.model_fields:
        assert getattr(stats.engine, name) == getattr(engine.executor, name), name
    assert (stats.engine.decode_step_ms, stats.engine.prefill_step_ms) == (4.0, 9.0)


def test_build_worker_stats_merges_the_workers_and_the_engines_counts() -> None:
    engine = EngineStats(
        num_running=2,
        device_adapters=("a",),
        adapter_ranks={"a": 8, "h": 4},
        decode_step_ms=4.0,
        num_adapter_load_failures=1,
        executor=ExecutorStats(
            backend="vllm", max_lora_rank=64, kernel_choices={"op": "x"}, kernel_tuner_s=0.5
        ),
    )
    worker = WorkerState(
        worker_id="w",
        base_model="b",
        max_num_seqs=4,
        host_adapters=("h", "g"),
        known_ranks={"h": 16, "g": 32},
        num_load_failures=2,
        is_draining=True,
    )
    stats = build_worker_stats(engine, worker)
    assert (stats.scheduler.num_running, stats.scheduler.device_adapters, stats.host_adapters) == (
        2,
        ("a",),
        ("h", "g"),
    )
    assert stats.scheduler.adapter_ranks == {"a": 8, "h": 4, "g": 32}  # the engine's rank wins
    assert stats.engine == EngineSummary(
        backend="vllm", max_lora_rank=64, kernel_choices={"op": "x"}, kernel_tuner_s=0.5, decode_step_ms=4.0
    )
    assert stats.num_load_failures == 3 and not stats.is_ready and stats.is_draining
