"""Where each adapter version lives now, from the live workers' heartbeats: the console's residency column.

Tiers, best first: `device` (in some worker's device memory: no load before its next request), `host` (its
verified files are in some worker's host cache: a copy to the device, no fetch), `disk` (ready, only in the blob
store: fetched on its next request) and `none` (not servable: validating, failed or deleted). Cold starts are
the copies to the device the workers counted since they registered the version; the load time is the last
measured copy (scheduler/core/scheduler_stats.py adapter_num_loads, adapter_load_seconds).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cluster.membership import WorkerRecord

TIERS: tuple[str, ...] = ("device", "host", "disk", "none")


@dataclass(frozen=True)
class VersionResidency:
    """One adapter version across the live workers."""

    tier: str  # one of TIERS
    num_device_workers: int  # workers holding it in device memory
    num_cold_starts: int  # copies to the device counted by the live workers
    last_load_s: float | None  # the longest of the workers' last measured copies (None: none measured)


def version_residency(workers: Iterable[WorkerRecord], version_id: str, is_ready: bool) -> VersionResidency:
    """Where `version_id` is now (is_ready: its status is `ready`, so its files are in the blob store)."""
    workers = list(workers)
    on_device = [w for w in workers if version_id in w.scheduler.device_adapters]
    on_host = [w for w in workers if version_id in w.host_adapters]
    loads = [
        w.scheduler.adapter_load_seconds[version_id]
        for w in workers
        if version_id in w.scheduler.adapter_load_seconds
    ]
    if on_device:
        tier = "device"
    elif on_host:
        tier = "host"
    else:
        tier = "disk" if is_ready else "none"
    return VersionResidency(
        tier,
        len(on_device),
        sum(w.scheduler.adapter_num_loads.get(version_id, 0) for w in workers),
        max(loads) if loads else None,
    )
