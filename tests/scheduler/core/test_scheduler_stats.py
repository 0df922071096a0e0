"""The engine core's stats (`BatchScheduler.make_stats`): queues, ranks and tenants the router reads, the page
split and the adapter counters, built from the core's own state (no torch)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.adapter_residency import AdapterResidency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from scheduler.core.scheduler_stats import SchedulerStats
from tests.scheduler.core.scheduler_helpers import BLOCK_SIZE, PAGE_BYTES, make_seq


def _scheduler(max_num_seqs: int = 1) -> BatchScheduler:
    pool = PagePool(32 + 8, BLOCK_SIZE, 32)
    residency = AdapterResidency(pool, PAGE_BYTES)
    residency.register("r8", "/host/r8", rank=8, num_bytes=100)
    residency.register("r64", "/host/r64", rank=64, num_bytes=100)
    return BatchScheduler(pool, residency, FifoPolicy(), max_num_seqs, 64, num_cpu_prefill_workers=1)


def test_an_idle_core_reports_its_pool_and_registered_adapters() -> None:
    stats = _scheduler().make_stats()
    assert (stats.num_running, stats.num_waiting, stats.running_ranks, stats.waiting_ranks) == (0, 0, (), ())
    assert stats.num_total_kv_blocks == 32 and stats.num_free_kv_blocks == 32 and stats.num_pool_pages == 40
    assert stats.adapter_ranks == {"r8": 8, "r64": 64} and stats.device_adapters == ()
    assert stats.num_host_adapters == 2 and stats.adapter_eviction_policy == "lru"


def test_running_and_queued_requests_are_reported_with_their_ranks_and_tenants() -> None:
    scheduler = _scheduler(max_num_seqs=1)
    first = make_seq("first", 5, 3, "r64", 0.0)
    second, third = make_seq("second", 6, 3, "r8", 1.0), make_seq("third", 2, 3, None, 2.0)
    second.tenant_id = "t1"
    scheduler.add(first)
    scheduler.schedule()  # plans r64's load; "first" waits for its host copy
    scheduler.on_adapter_prepared("r64")
    for seq in (second, third):
        scheduler.add(seq)
    scheduler.schedule()  # one slot: "first" runs (on the host copy), the others wait
    stats = scheduler.make_stats()
    assert (stats.num_running, stats.num_waiting) == (1, 2)
    assert stats.running_ranks == (64,) and stats.waiting_ranks == (8, 0)
    assert stats.num_waiting_prompt_tokens == 6 + 2
    assert stats.num_waiting_by_tenant == {"t1": 1, "": 1}  # no tenant: fair share's anonymous tenant
    assert stats.num_running_by_adapter == {"r64": 1}
    assert stats.num_waiting_by_adapter == {"r8": 1}  # the base-model request is not an adapter's
    assert stats.num_adapter_misses == 1 and stats.num_adapter_prefetches == 1  # the queued r8's copy started
    assert stats.device_adapters == ("r64", "r8")
    assert stats.num_cpu_assisted_prefills == 1  # its prefill ran on the host copy while it copied
    assert stats.num_prepare_waits == 1  # and waited one step for that host copy


def test_stats_are_frozen_and_serialise_to_json_lists() -> None:
    stats = SchedulerStats(running_ranks=(8, 0), num_waiting_by_tenant={"t": 1})
    assert stats.model_dump(mode="json")["running_ranks"] == [8, 0]
    with pytest.raises(ValidationError):
        stats.num_running = 3  # type: ignore[misc]


def test_each_registered_adapter_reports_its_copies_and_last_load_time() -> None:
    scheduler = _scheduler()
    residency = scheduler.residency
    for seconds in (0.5, 0.25):
        assert residency.plan_load("r8", may_evict_waiting=False) is not None
        residency.mark_loaded("r8", seconds)
        residency.evict("r8")
    assert residency.plan_load("r64", may_evict_waiting=False) is not None
    residency.mark_loaded("r64")  # not timed
    stats = scheduler.make_stats()
    assert stats.adapter_num_loads == {"r8": 2, "r64": 1}
    assert stats.adapter_load_seconds == {"r8": 0.25}
    residency.forget("r8")
    assert "r8" not in scheduler.make_stats().adapter_num_loads  # forgotten with its registration
