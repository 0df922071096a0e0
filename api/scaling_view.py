"""The autoscaling decisions an API server reports (GET /v1/admin/scaling, lorahost_desired_workers).

Inputs: the demand the placement job published with the routing table (forecast and cooldown-peak tokens/s per
rank, last request per base model; cluster/routing_table.py), the live workers and their queues (the worker
directory) and the requests waiting in this API server's cold starts (lorahost_cold_start_waiting_requests).
The decision itself is scheduler/scaling.py. Every base model with a live worker, published demand or a
waiting request is reported (so a request waiting for a model with no worker asks for a scale-up from zero).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from api.metrics import ApiMetrics
from cluster.membership import WorkerRecord
from cluster.routing_table import CachedRoutingTable, ModelDemand, RoutingTable
from cluster.waiting_requests import WaitingRequests
from scheduler.scaling import BaseModelLoad, ScalingDecision, ScalingPolicy, decide_scaling
from settings import Settings

log = logging.getLogger(__name__)
WAITING_TTL_PERIODS = 3  # a replica's published waiters live this many refresh periods


def scaling_policy(settings: Settings) -> ScalingPolicy:
    """The autoscaling policy from settings (scaling_*, scale_*, the capacity model)."""
    return ScalingPolicy(
        operating_points=settings.placement.resolved_operating_points(),
        target_utilisation=settings.scaling.target_utilisation,
        min_workers=settings.scaling.min_workers,
        max_workers=settings.scaling.max_workers,
        scale_to_zero_idle_s=settings.scaling.scale_to_zero_idle_s,
        scale_down_cooldown_s=settings.scaling.scale_down_cooldown_s,
        max_waiting_per_worker=settings.scaling.max_waiting_per_worker,
    )


def cold_start_waiting(metrics: ApiMetrics) -> dict[str, int]:
    """Requests waiting now in this API server's cold starts, per base model."""
    waiting: dict[str, int] = {}
    for family in metrics.cold_start_waiting.collect():
        for sample in family.samples:
            if sample.value > 0:
                waiting[sample.labels["base_model"]] = int(sample.value)
    return waiting


def model_loads(
    table: RoutingTable | None,
    records: Iterable[WorkerRecord],
    waiting: Mapping[str, int],
    now_s: float,
    extra_models: Iterable[str] = (),
) -> list[BaseModelLoad]:
    """One BaseModelLoad per base model known from the table's demand, the live workers, `waiting` or
    `extra_models` (sorted by name)."""
    demand = {d.base_model: d for d in (table.demand if table else ())}
    live = [r for r in records if r.is_ready and not r.is_draining]
    names = sorted({*demand, *(r.base_model for r in live), *waiting, *extra_models})
    return [
        _load(name, demand.get(name), [r for r in live if r.base_model == name], waiting.get(name, 0), now_s)
        for name in names
    ]


def _load(
    name: str, demand: ModelDemand | None, workers: list[WorkerRecord], num_cold: int, now_s: float
) -> BaseModelLoad:
    last = demand.last_request_at if demand else None
    idle_s = None if last is None else max(0.0, now_s - last)
    if any(r.num_running or r.num_waiting or r.num_active for r in workers):
        idle_s = 0.0  # serving now, whatever the last published demand says
    return BaseModelLoad(
        base_model=name,
        num_live_workers=len(workers),
        demand_by_rank=dict(demand.demand_by_rank) if demand else {},
        peak_demand_by_rank=dict(demand.peak_demand_by_rank) if demand else {},
        idle_s=idle_s,
        num_waiting=num_cold + sum(r.num_waiting for r in workers),
    )


@dataclass
class ScalingView:
    """The autoscaling decisions from this API server's components (built with the services; `list_workers`
    reads the worker directory published at call time)."""

    settings: Settings
    metrics: ApiMetrics
    routing_table: CachedRoutingTable
    waiting_requests: WaitingRequests
    list_workers: Callable[[], list[WorkerRecord]]

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

    def desired_workers(self) -> list[tuple[str, int]]:
        """(base model, desired workers) pairs of the decisions (the lorahost_desired_workers gauge)."""
        return [(d.base_model, d.desired_workers) for d in self.decisions()]
