"""What a cluster-twin run takes beyond the settings (`ClusterOptions`) and what it returns (`ClusterResult`:
records, worker counts over time, per-worker summaries, scaling decisions, published routing tables, speed);
the event loop is twin/cluster_sim.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster.protocol import WorkerStats
from cluster.routing_table import RoutingTable
from scheduler.scaling.scale_plan import DEFAULT_INTERVAL_S
from scheduler.scaling.scaling import ScalingDecision
from twin.request_record import RequestRecord

# No setting or profile says how long a worker takes to become ready (process start, base model load, kernel
# tuning): 30 s is a cached 8B-class checkpoint loaded onto one GPU. Pass the measured value for a plan.
DEFAULT_COLD_START_S = 30.0


@dataclass(frozen=True)
class ClusterOptions:
    """What the settings do not say. adapter_fetch_s: blob store -> worker host cache per adapter (None:
    settings.routing.cold_fetch_ms, the router's own estimate of it); num_initial_workers: ready at time 0."""

    cold_start_s: float = DEFAULT_COLD_START_S
    scaling_interval_s: float = DEFAULT_INTERVAL_S
    num_initial_workers: int = 1
    is_autoscaling: bool = True
    adapter_fetch_s: float | None = None


@dataclass(frozen=True)
class WorkerCountSample:
    """The workers at `time_s` (after a change): routable, starting (cold), draining."""

    time_s: float
    num_ready: int
    num_starting: int
    num_draining: int


@dataclass(frozen=True)
class WorkerSummary:
    """One worker's life and its final published stats."""

    worker_id: str
    started_s: float
    ready_s: float | None
    stopped_s: float | None
    num_requests: int
    stats: WorkerStats


@dataclass
class ClusterResult:
    """Every request's record (trace order; `worker_id` None when refused at the front door), the worker
    count over time, per-worker summaries, scaling decisions and published tables, and the run's speed."""

    records: list[RequestRecord]
    worker_counts: list[WorkerCountSample]
    workers: list[WorkerSummary]
    scaling_decisions: list[tuple[float, ScalingDecision]] = field(default_factory=list)
    routing_tables: list[RoutingTable] = field(default_factory=list)
    simulated_s: float = 0.0
    wall_s: float = 0.0

    @property
    def simulated_s_per_wall_s(self) -> float:
        """Simulated seconds per wall-clock second of the run."""
        return self.simulated_s / max(self.wall_s, 1e-9)
