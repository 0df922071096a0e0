"""The autoscaling decisions an API server reports (GET /v1/admin/scaling, lorahost_desired_workers).

Inputs: the demand the placement job published with the routing table (forecast and cooldown-peak tokens/s per
rank, last request per base model; cluster/routing_table.py), the live workers and their queues (the worker
directory) and the requests waiting in this API server's cold starts (lorahost_cold_start_waiting_requests).
The decision itself is scheduler/scaling/scaling.py, its inputs are built by cluster/model_load.py (pure: the cluster
twin builds them the same way). Every base model with a live worker, published demand or a
waiting request is reported (so a request waiting for a model with no worker asks for a scale-up from zero).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from api.metrics import ApiMetrics
from api.scaling_history import ScalingHistory
from cluster.membership import WorkerRecord
from cluster.model_load import model_loads, scaling_policy
from cluster.routing_table import CachedRoutingTable
from cluster.waiting_requests import WaitingRequests
from scheduler.scaling.scaling import ScalingDecision, decide_scaling
from settings import Settings

log = logging.getLogger(__name__)
__all__ = ["ScalingView", "cold_start_waiting", "model_loads", "scaling_policy"]
WAITING_TTL_PERIODS = 3  # a replica's published waiters live this many refresh periods


def cold_start_waiting(metrics: ApiMetrics) -> dict[str, int]:
    """Requests waiting now in this API server's cold starts, per base model."""
    waiting: dict[str, int] = {}
    for family in metrics.cold_start_waiting.collect():
        for sample in family.samples:
            if sample.value > 0:
                waiting[sample.labels["base_model"]] = int(sample.value)
    return waiting


@dataclass
class ScalingView:
    """The autoscaling decisions from this API server's components (built with the services; `list_workers`
    reads the worker directory published at call time)."""

    settings: Settings
    metrics: ApiMetrics
    routing_table: CachedRoutingTable
    waiting_requests: WaitingRequests
    list_workers: Callable[[], list[WorkerRecord]]
    history: ScalingHistory = field(
        default_factory=ScalingHistory
    )  # sampled by `sample` (the console's chart)

    def publish_waiting(self) -> dict[str, int]:
        """Publish this API server's cold-start waiters (for the other replicas); returns them."""
        local = cold_start_waiting(self.metrics)
        ttl_s = WAITING_TTL_PERIODS * self.settings.routing.table_refresh_s
        self.waiting_requests.publish(self.settings.api.resolved_api_instance_id(), local, ttl_s)
        return local

    def all_waiting(self) -> dict[str, int]:
        """Cold-start waiters per base model on every API replica (this one's only, when the store is away)."""
        try:
            self.publish_waiting()
            return self.waiting_requests.totals()
        except Exception as exc:  # noqa: BLE001 - Redis away: decide on what this replica knows
            log.warning("could not read other API servers' waiting requests: %s", exc)
            return cold_start_waiting(self.metrics)

    def decisions(
        self, extra_models: Iterable[str] = (), now_s: float | None = None
    ) -> list[ScalingDecision]:
        """Decisions from the cached routing table, the live workers and every replica's cold-start waiters."""
        policy = scaling_policy(self.settings)
        loads = model_loads(
            self.routing_table.table,
            self.list_workers(),
            self.all_waiting(),
            time.time() if now_s is None else now_s,
            extra_models,
        )
        return [decide_scaling(load, policy) for load in loads]

    def sample(self) -> None:
        """Publish this server's waiters, decide, and keep the decisions in `history` (the refresh timer)."""
        now_s = time.time()
        self.history.record(self.decisions(now_s=now_s), now_s)

    def desired_workers(self) -> list[tuple[str, int]]:
        """(base model, desired workers) pairs of the decisions (the lorahost_desired_workers gauge)."""
        return [(d.base_model, d.desired_workers) for d in self.decisions()]
