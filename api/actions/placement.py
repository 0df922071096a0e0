"""The published routing table and the autoscaling decisions (/v1/admin/placement, /v1/admin/scaling and the
console's placement page). Both re-read the published table first (admin calls are rare; requests read the
cached copy)."""

from __future__ import annotations

from datetime import UTC, datetime

from api.report_schemas import (
    PlacementReport,
    RoutingWeightPublic,
    ScalingDecisionPublic,
    ScalingReport,
    WorkerPlacementPublic,
)
from api.services import Services
from cluster.routing_table import RoutingTable
from scheduler.scaling.scaling import ScalingDecision


def placement_report(services: Services) -> PlacementReport:
    """The routing table (adapter version id -> [(worker, weight)]), its version and computed_at, per-worker
    load (1 = capacity) and max rank, and the adapters the last run moved. Version 0 before any run."""
    table = _refreshed_table(services)
    if table is None:
        return PlacementReport(version=0, computed_at=None, table={}, workers=[], moved=[])
    return PlacementReport(
        version=table.version,
        computed_at=datetime.fromtimestamp(table.computed_at, tz=UTC),
        table={
            k: [RoutingWeightPublic(worker_id=w, weight=p) for w, p in row]
            for k, row in sorted(table.rows.items())
        },
        workers=[WorkerPlacementPublic(**vars(w)) for w in table.workers],
        moved=list(table.moved),
    )


def scaling_report(services: Services) -> ScalingReport:
    """Desired workers per base model."""
    return ScalingReport(base_models=[_public(d) for d in _decisions(services, None)])


def scaling_decision(services: Services, base_model: str) -> ScalingDecisionPublic:
    """One base model's desired workers (any name: one with no worker, demand or waiting request gets 0 and
    says so)."""
    return _public(next(d for d in _decisions(services, base_model) if d.base_model == base_model))


def _refreshed_table(services: Services) -> RoutingTable | None:
    try:
        return services.routing_table.refresh()
    except Exception:  # noqa: BLE001 - the store is away: report the last copy
        return services.routing_table.table


def _decisions(services: Services, base_model: str | None) -> list[ScalingDecision]:
    _refreshed_table(services)
    return services.scaling.decisions(extra_models=() if base_model is None else (base_model,))


def _public(decision: ScalingDecision) -> ScalingDecisionPublic:
    return ScalingDecisionPublic(
        base_model=decision.base_model,
        desired_workers=decision.desired_workers,
        live_workers=decision.live_workers,
        demand_tokens_per_s=decision.demand_tokens_per_s,
        reason=decision.reason,
    )
