"""The one conversion from a worker's published stats to the router's view: every WorkerView field is read
by name, so a routing signal reaches the router without a per-field mapping."""

from __future__ import annotations

import dataclasses

from cluster.membership import WorkerRecord
from cluster.protocol import WorkerStats
from cluster.worker_view import worker_view
from scheduler.routing.perf_model import DEFAULT_PERF_MODEL
from scheduler.routing.router import WorkerView


def test_every_view_field_is_published_by_the_workers_stats() -> None:
    assert {f.name for f in dataclasses.fields(WorkerView)} <= set(WorkerStats.model_fields)


def test_the_view_carries_each_published_field_by_name() -> None:
    record = WorkerRecord(
        "w1",
        "http://w1",
        "base",
        num_running=2,
        num_waiting=3,
        max_num_seqs=8,
        device_adapters=("a",),
        host_adapters=("b",),
        adapter_ranks={"a": 8},
        running_ranks=(8, 0),
        waiting_ranks=(16,),
        num_waiting_prompt_tokens=30,
        num_waiting_by_tenant={"t": 3},
        num_free_pool_pages=5,
        decode_step_ms=9.0,
        prefill_step_ms=20.0,
        perf_model=DEFAULT_PERF_MODEL.to_dict(),
    )
    view = worker_view(record)
    assert view == WorkerView(
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
    )


def test_a_draining_worker_is_not_ready_and_an_unreadable_profile_is_ignored() -> None:
    record = WorkerRecord(
        "w1", "http://w1", "base", is_ready=True, is_draining=True, perf_model={"prefill": {}}
    )
    view = worker_view(record)
    assert not view.is_ready and view.perf_model is None
