from typing import Any, Iterator

import pytest

from cluster.membership import InMemoryWorkerDirectory, RedisWorkerDirectory, WorkerDirectory, WorkerRecord
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
    return WorkerRecord(worker_id, f"http://127.0.0.1/{worker_id}", "base", num_running=running,
                        device_adapters=("a@1",), host_adapters=("b@2",))


def test_heartbeat_registers_and_refreshes_worker(directory: WorkerDirectory) -> None:
    directory.heartbeat(_record("w2"), ttl_s=30)
    directory.heartbeat(_record("w1"), ttl_s=30)
    directory.heartbeat(_record("w1", running=3), ttl_s=30)
    live = directory.list_live()
    assert [r.worker_id for r in live] == ["w1", "w2"]
    assert live[0].num_running == 3
    assert live[0].device_adapters == ("a@1",)


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
    time.sleep(0.4)
    assert directory.list_live() == []
    gen.close()
