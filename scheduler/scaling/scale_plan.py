"""How a scaler acts on a desired worker count: how many workers to start and which to stop (the newest
first: the older ones hold warm adapters). Pure: the local process scaler (lorahost/scaler.py, as KEDA does
in production) and the cluster twin (twin/cluster_sim.py) both apply it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_INTERVAL_S = 2.0  # seconds between a scaler's polls of the desired count (lorahost dev-cluster)


@dataclass(frozen=True)
class ScalePlan:
    """Process actions: start num_to_start workers, SIGTERM (drain) the workers in stop_ids."""

    num_to_start: int = 0
    stop_ids: tuple[str, ...] = ()

    @property
    def is_noop(self) -> bool:
        """True when nothing changes."""
        return self.num_to_start == 0 and not self.stop_ids


def plan_scaling(desired_workers: int, worker_ids: Sequence[str], max_workers: int) -> ScalePlan:
    """The actions that bring the managed workers (`worker_ids`, oldest first, starting ones included) to
    `desired_workers`, clamped to [0, max_workers]; scale-down stops the newest first."""
    target = max(0, min(desired_workers, max_workers))
    num_managed = len(worker_ids)
    if target >= num_managed:
        return ScalePlan(num_to_start=target - num_managed)
    return ScalePlan(stop_ids=tuple(reversed(worker_ids[target:])))
