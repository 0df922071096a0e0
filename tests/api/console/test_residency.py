"""An adapter version's residency tier, cold starts and load time across the live workers."""

from __future__ import annotations

from typing import Any

from api.console.residency import version_residency
from cluster.membership import WorkerRecord
from scheduler.core.scheduler_stats import SchedulerStats


def _worker(worker_id: str, host_adapters: tuple[str, ...] = (), **core: Any) -> WorkerRecord:
    scheduler = SchedulerStats(**core)
    return WorkerRecord(
        worker_id, f"http://{worker_id}", "base", host_adapters=host_adapters, scheduler=scheduler
    )


def test_the_best_tier_wins_and_counts_add_up_across_workers() -> None:
    workers = [
        _worker("a", device_adapters=("v",), adapter_num_loads={"v": 2}, adapter_load_seconds={"v": 0.01}),
        _worker("b", host_adapters=("v",), adapter_num_loads={"v": 1}, adapter_load_seconds={"v": 0.03}),
    ]
    where = version_residency(workers, "v", is_ready=True)
    assert (where.tier, where.num_device_workers, where.num_cold_starts, where.last_load_s) == (
        "device",
        1,
        3,
        0.03,
    )
    assert version_residency(workers[1:], "v", is_ready=True).tier == "host"


def test_a_version_on_no_worker_is_on_disk_when_ready_else_nowhere() -> None:
    assert version_residency([_worker("a")], "v", is_ready=True).tier == "disk"
    none = version_residency([], "v", is_ready=False)
    assert (none.tier, none.num_cold_starts, none.last_load_s) == ("none", 0, None)
