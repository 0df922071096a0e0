"""The one conversion from a worker's published stats to the router's view: every WorkerView field is read
from the WorkerStats part that holds it, none left at its default."""

from __future__ import annotations

import dataclasses

from cluster.membership import WorkerRecord
from cluster.protocol import EngineSummary
from cluster.worker_view import worker_view
from scheduler.core.scheduler_stats import SchedulerStats
from scheduler.routing.perf_model import DEFAULT_PERF_MODEL
from scheduler.routing.router import WorkerView


def _published_record() -> WorkerRecord:
    """A record with every field the router reads away from its default."""
    return WorkerRecord(
        "w1",
        "http://w1",
        "base",
        max_num_seqs=8,
        host_adapters=("b",),
        is_ready=True,
        perf_model=DEFAULT_PERF_MODEL.to_dict(),
        scheduler=SchedulerStats(
            num_running=2,
            num_waiting=3,
            device_adapters=("a",),
            adapter_ranks={"a": 8},
            running_ranks=(8, 0),
            waiting_ranks=(16,),
            num_waiting_prompt_tokens=30,
            num_waiting_by_tenant={"t": 3},
            num_free_pool_pages=5,
        ),
        engine=EngineSummary(decode_step_ms=9.0, prefill_step_ms=20.0, max_lora_rank=64, backend="vllm"),
    )


def test_the_view_carries_each_published_field() -> None:
    assert worker_view(_published_record()) == WorkerView(
        "w1",
        "base",
        num_running=2,
        num_waiting=3,
        max_num_seqs=8,
        device_adapters=frozenset({"a"}),
        host_adapters=frozenset({"b"}),
        adapter_ranks={"a": 8},
        running_ranks=(8, 0),
        waiting_ranks=(16,),
        num_waiting_prompt_tokens=30,
        num_waiting_by_tenant={"t": 3},
        num_free_pool_pages=5,
        decode_step_ms=9.0,
        prefill_step_ms=20.0,
        perf_model=DEFAULT_PERF_MODEL,
        max_lora_rank=64,
        engine_backend="vllm",
    )


def test_no_view_field_is_left_at_its_default() -> None:
    """A WorkerView field worker_view does not fill (or the record above does not publish) fails here."""
    view = worker_view(_published_record())
    defaults = WorkerView("", "", is_ready=False)
    unfilled = [
        f.name for f in dataclasses.fields(WorkerView) if getattr(view, f.name) == getattr(defaults, f.name)
    ]
    assert unfilled == []


def test_a_draining_worker_is_not_ready_and_an_unreadable_profile_is_ignored() -> None:
    record = WorkerRecord(
        "w1", "http://w1", "base", is_ready=True, is_draining=True, perf_model={"prefill": {}}
    )
    view = worker_view(record)
    assert not view.is_ready and view.perf_model is None
