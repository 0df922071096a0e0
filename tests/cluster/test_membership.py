import json
from collections.abc import Iterator

import pytest

from cluster.membership import InMemoryWorkerDirectory, RedisWorkerDirectory, WorkerDirectory, WorkerRecord
from cluster.protocol import EngineSummary, WorkerStats
from scheduler.core.scheduler_stats import SchedulerStats
from tests.services import redis_with_prefix


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def directory(request: pytest.FixtureRequest) -> Iterator[WorkerDirectory]:
    if request.param == "memory":
        yield InMemoryWorkerDirectory()
        return
    gen = redis_with_prefix()
    client, prefix = next(gen)
    yield RedisWorkerDirectory(client, key_prefix=prefix)
    gen.close()


def _record(worker_id: str, running: int = 0) -> WorkerRecord:
    return WorkerRecord(
        worker_id,
        f"http://127.0.0.1/{worker_id}",
        "base",
        host_adapters=("b@2",),
        scheduler=SchedulerStats(num_running=running, device_adapters=("a@1",)),
    )


def test_heartbeat_registers_and_refreshes_worker(directory: WorkerDirectory) -> None:
    directory.heartbeat(_record("w2"), ttl_s=30)
    directory.heartbeat(_record("w1"), ttl_s=30)
    directory.heartbeat(_record("w1", running=3), ttl_s=30)
    live = directory.list_live()
    assert [r.worker_id for r in live] == ["w1", "w2"]
    assert live[0].scheduler.num_running == 3
    assert live[0].scheduler.device_adapters == ("a@1",)


def test_removed_worker_is_not_listed(directory: WorkerDirectory) -> None:
    directory.heartbeat(_record("w1"), ttl_s=30)
    directory.remove("w1")
    assert directory.list_live() == []


def test_worker_expires_after_ttl_in_memory() -> None:
    clock = FakeClock()
    directory = InMemoryWorkerDirectory(clock=clock)
    directory.heartbeat(_record("w1"), ttl_s=5)
    clock.now += 6
    assert directory.list_live() == []


def test_worker_expires_after_ttl_in_redis() -> None:
    import time

    gen = redis_with_prefix()
    client, prefix = next(gen)
    directory = RedisWorkerDirectory(client, key_prefix=prefix)
    directory.heartbeat(_record("w1"), ttl_s=0.2)
    assert [r.worker_id for r in directory.list_live()] == ["w1"]
    deadline = time.monotonic() + 30  # Redis expires the key on its own clock: wait for it, bounded
    while directory.list_live() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert directory.list_live() == []
    gen.close()


def test_record_is_the_workers_stats_plus_its_url() -> None:
    stats = WorkerStats(
        worker_id="w1",
        base_model="base",
        max_num_seqs=8,
        host_adapters=["b"],  # type: ignore[arg-type]
        num_active=3,
        num_cache_hits=4,
        num_cache_misses=5,
        num_adapter_unloads=7,
        num_load_failures=8,
        is_ready=False,
        is_draining=True,
        scheduler=SchedulerStats(
            num_running=2,
            num_waiting=1,
            device_adapters=["a"],  # type: ignore[arg-type]
            num_free_kv_blocks=10,
            num_total_kv_blocks=20,
            num_adapter_loads=6,
            running_ranks=[8, 0],  # type: ignore[arg-type]
            waiting_ranks=[64],  # type: ignore[arg-type]
            num_waiting_by_queue=[1],  # type: ignore[arg-type]
        ),
        engine=EngineSummary(backend="vllm", max_lora_rank=32, decode_step_ms=2.5),
    )
    record = WorkerRecord.from_stats(stats, "http://w1")
    assert (
        record.url == "http://w1"
        and record.scheduler.device_adapters == ("a",)
        and record.host_adapters == ("b",)
    )
    assert WorkerStats.model_validate(record.model_dump(exclude={"url"})) == stats
    assert (record.scheduler.running_ranks, record.scheduler.num_waiting_by_queue) == ((8, 0), (1,))
    assert WorkerRecord.from_json(record.to_json()) == record
    assert json.loads(record.to_json())["engine"]["max_lora_rank"] == 32  # stored nested


def test_stored_records_of_other_versions_parse() -> None:
    """Rolling upgrades: a newer worker's unknown keys are ignored; an older one's `extra` counters are read."""
    newer = (
        '{"worker_id": "w1", "url": "http://w1", "base_model": "base", "num_gpus": 2, "num_cache_hits": 3, '
        '"scheduler": {"num_running": 1, "num_gpu_streams": 2}, "engine": {"backend": "native", "tflops": 9}}'
    )
    assert WorkerRecord.from_json(newer) == WorkerRecord(
        "w1", "http://w1", "base", num_cache_hits=3, scheduler=SchedulerStats(num_running=1)
    )
    older = (
        '{"worker_id": "w1", "url": "http://w1", "base_model": "base", "device_adapters": ["a"], '
        '"extra": {"num_active": 2, "num_free_kv_blocks": 9, "num_load_failures": 1, "gone": 0}}'
    )
    parsed = WorkerRecord.from_json(older)
    assert (parsed.num_active, parsed.scheduler.num_free_kv_blocks, parsed.num_load_failures) == (2, 9, 1)
    assert parsed.scheduler.device_adapters == ("a",)


def test_records_stored_in_the_flat_format_parse_nested_and_null_lists_are_empty() -> None:
    stored = {
        "worker_id": "w1",
        "url": "http://w1",
        "base_model": "base",
        "engine": "vllm",
        "max_lora_rank": 64,
        "num_running": 1,
        "num_waiting": 2,
        "max_num_seqs": 8,
        "device_adapters": ["a"],
        "host_adapters": None,
        "is_ready": True,
        "is_draining": False,
        "num_active": 1,
        "adapter_ranks": {"a": 8},
        "running_ranks": [8],
        "waiting_ranks": None,
        "num_waiting_by_queue": [],
        "num_waiting_by_tenant": None,
        "decode_step_ms": None,
        "perf_model": None,
        "kernel_choices": {"decode_lora": "sgmv"},
        "kernel_tuner_s": 0.5,
        "num_gpus": 2,
    }
    record = WorkerRecord.from_json(json.dumps(stored))
    core = record.scheduler
    assert core.device_adapters == ("a",) and record.host_adapters == () and core.waiting_ranks == ()
    assert (core.num_running, core.num_waiting, core.adapter_ranks, core.num_waiting_by_tenant) == (
        1,
        2,
        {"a": 8},
        {},
    )
    assert record.engine == EngineSummary(
        backend="vllm", max_lora_rank=64, kernel_choices={"decode_lora": "sgmv"}, kernel_tuner_s=0.5
    )
    assert (record.max_num_seqs, record.num_active, record.is_ready) == (8, 1, True)
    assert json.loads(record.to_json())["scheduler"]["device_adapters"] == ["a"]  # stored nested now
