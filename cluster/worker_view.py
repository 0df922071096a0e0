"""The one conversion from a worker's published state to what the router reads of it.

`worker_view` fills every field of `scheduler.routing.router.WorkerView` from the field of the same name of a
`WorkerStats` (a heartbeat `WorkerRecord` is one), so a routing signal is declared where it is computed
(`scheduler/core/scheduler_stats.py` for the core's) and in WorkerView, and nowhere in between. Lists become
tuples, the adapter lists frozensets; a draining worker is not ready; a profile that does not parse is
ignored (the router uses its default model for that worker).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from cluster.protocol import WorkerStats
from scheduler.routing.perf_model import PerfModel
from scheduler.routing.router import WorkerView

log = logging.getLogger(__name__)

_VIEW_FIELDS = tuple(f.name for f in dataclasses.fields(WorkerView))
_SET_FIELDS = frozenset({"device_adapters", "host_adapters"})


def worker_view(stats: WorkerStats) -> WorkerView:
    """What the router knows about the worker whose published state is `stats`."""
    values: dict[str, Any] = {}
    for name in _VIEW_FIELDS:
        if name not in WorkerStats.model_fields:
            continue
        value = getattr(stats, name)
        if name in _SET_FIELDS:
            value = frozenset(value)
        elif isinstance(value, list):
            value = tuple(value)
        values[name] = value
    values["is_ready"] = stats.is_ready and not stats.is_draining
    values["perf_model"] = perf_model_of(stats)
    return WorkerView(**values)


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
