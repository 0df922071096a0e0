"""The autoscaler's inputs, per base model: `BaseModelLoad`s from the published demand (routing table), the
live worker records and the cold-start waiters, and the `ScalingPolicy` from settings. Pure: the API's
scaling view (api/scaling_view.py) and the cluster twin (twin/cluster_sim.py) both build the
decision's inputs here and call scheduler/scaling/scaling.py `decide_scaling`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cluster.membership import WorkerRecord
from cluster.routing_table import ModelDemand, RoutingTable
from scheduler.scaling.scaling import BaseModelLoad, ScalingPolicy
from settings import Settings


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
    if any(r.scheduler.num_running or r.scheduler.num_waiting or r.num_active for r in workers):
        idle_s = 0.0  # serving now, whatever the last published demand says
    return BaseModelLoad(
        base_model=name,
        num_live_workers=len(workers),
        demand_by_rank=dict(demand.demand_by_rank) if demand else {},
        peak_demand_by_rank=dict(demand.peak_demand_by_rank) if demand else {},
        idle_s=idle_s,
        num_waiting=num_cold + sum(r.scheduler.num_waiting for r in workers),
    )
