"""The one conversion from a worker's published state to what the router reads of it.

`worker_view` fills every field of `scheduler.routing.router.WorkerView` from the `WorkerStats` part that
holds it: the worker's own fields, `scheduler` (the engine core's queues, residency and routing signals) or
`engine` (its step timings and rank limit). A routing signal is declared where it is computed
(`scheduler/core/scheduler_stats.py` for the core's), in WorkerView, and read here; tests/cluster/
test_worker_view.py fails when a WorkerView field is left at its default. The adapter lists become
frozensets; a draining worker is not ready; a profile that does not parse is ignored (the router uses its
default model for that worker).
"""

from __future__ import annotations

import logging

from cluster.protocol import WorkerStats
from scheduler.routing.perf_model import PerfModel
from scheduler.routing.router import WorkerView

log = logging.getLogger(__name__)


def worker_view(stats: WorkerStats) -> WorkerView:
    """What the router knows about the worker whose published state is `stats`."""
    core, engine = stats.scheduler, stats.engine
    return WorkerView(
        worker_id=stats.worker_id,
        base_model=stats.base_model,
        num_running=core.num_running,
        num_waiting=core.num_waiting,
        max_num_seqs=stats.max_num_seqs,
        device_adapters=frozenset(core.device_adapters),
        host_adapters=frozenset(stats.host_adapters),
        is_ready=stats.is_ready and not stats.is_draining,
        adapter_ranks=core.adapter_ranks,
        running_ranks=core.running_ranks,
        waiting_ranks=core.waiting_ranks,
        num_waiting_prompt_tokens=core.num_waiting_prompt_tokens,
        num_waiting_by_tenant=core.num_waiting_by_tenant,
        num_free_pool_pages=core.num_free_pool_pages,
        decode_step_ms=engine.decode_step_ms,
        prefill_step_ms=engine.prefill_step_ms,
        perf_model=perf_model_of(stats),
        max_lora_rank=engine.max_lora_rank,
        engine_backend=engine.backend,
    )


def perf_model_of(stats: WorkerStats) -> PerfModel | None:
    """The worker's published performance model, or None (none published, or one this build cannot read)."""
    if stats.perf_model is None:
        return None
    try:
        return PerfModel.from_dict(stats.perf_model)
    except ValueError as exc:
        if stats.worker_id not in _BAD_PROFILE_WORKERS:
            _BAD_PROFILE_WORKERS.add(stats.worker_id)
            log.warning(
                "worker %s publishes an unreadable profile (%s); routing it with the default model",
                stats.worker_id,
                exc,
            )
        return None


_BAD_PROFILE_WORKERS: set[str] = set()  # warned once each
