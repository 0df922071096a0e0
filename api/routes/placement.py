"""/v1/admin/placement and /v1/admin/scaling: the published routing table and the autoscaling decisions
(admin key only). The work: api/actions/placement.py."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api.actions import placement
from api.deps import AdminDep, ServicesDep
from api.report_schemas import PlacementReport, ScalingDecisionPublic, ScalingReport
from api.request_text import TextCheckedRoute

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=TextCheckedRoute)


@router.get("/placement", response_model=PlacementReport)
async def get_placement(_: AdminDep, services: ServicesDep) -> PlacementReport:
    """The routing table (adapter version id -> [(worker, weight)]), its version and computed_at, per-worker
    load (1 = capacity) and max rank, and the adapters the last run moved. Version 0 before any run."""
    return await run_in_threadpool(placement.placement_report, services)


@router.get("/scaling", response_model=ScalingReport | ScalingDecisionPublic)
async def get_scaling(
    _: AdminDep, services: ServicesDep, base_model: str | None = None
) -> ScalingReport | ScalingDecisionPublic:
    """Desired workers per base model: `{"base_models": [...]}`, or with `?base_model=NAME` that model's
    object alone (any name: one with no worker, demand or waiting request gets 0 and says so)."""
    if base_model is not None:
        return await run_in_threadpool(placement.scaling_decision, services, base_model)
    return await run_in_threadpool(placement.scaling_report, services)
