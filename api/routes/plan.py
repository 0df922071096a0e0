"""POST /v1/admin/plan (admin key only): the capacity planner (scheduler/twin/planner/) on recorded demand
(usage rows over a window, registry/plan_demand.py) or on a given workload, with a twin profile. The answer is
`lorahost plan --json`'s: GPUs needed, per-GPU adapters and adapter caches, the surrogate's prediction and
the twin's check of every GPU. 400 with what to fix for a bad profile, SLO or workload, or no recorded demand;
422 for a malformed body. Planning runs in a worker thread (seconds; minutes when the surrogate's training
runs are not cached yet)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from sqlalchemy.orm import Session

from api.deps import AdminDep, ServicesDep, SessionDep
from api.errors import ApiError
from api.report_schemas import PlanRequest
from api.request_text import TextCheckedRoute
from registry.plan_demand import read_plan_demand
from scheduler.twin.planner.plan import PlanOptions
from scheduler.twin.planner.profile_lookup import resolve_profile
from scheduler.twin.planner.recorded_demand import workload_from_usage
from scheduler.twin.planner.run_planner import plan_workload
from scheduler.twin.planner.slo import parse_slo
from scheduler.twin.planner.surrogate import TrainingConfig
from scheduler.twin.planner.workload import Workload, workload_from_dict
from scheduler.twin.profile import ProfileError

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=TextCheckedRoute)


@router.post("/plan")
def create_capacity_plan(
    body: PlanRequest, _: AdminDep, services: ServicesDep, session: SessionDep
) -> dict[str, Any]:
    """Plan GPUs for the recorded demand (or `workload`) and check the plan in the twin (module doc); a sync
    route, so FastAPI runs it in a worker thread."""
    settings = services.settings
    try:
        profile = resolve_profile(body.profile or settings.placement.planner_profile)
        slo = parse_slo(body.slo) if body.slo else None
        workload = _workload(session, body)
    except (ProfileError, ValueError) as exc:
        raise ApiError(400, "invalid_request_error", str(exc)) from None
    options = PlanOptions(
        slo=slo, objective=body.objective, form=body.form, check_duration_s=body.check_s,
        max_lora_rank=settings.limits.max_rank,
    )  # fmt: skip
    report = plan_workload(
        workload,
        profile,
        settings.engine,
        options,
        training=TrainingConfig(num_samples=body.num_samples),
        cache_dir=settings.placement.planner_cache_dir or settings.data_dir / "planner",
        with_baselines=body.baselines,
    )
    return {"object": "capacity_plan", "window_s": None if body.workload else body.window_s} | report


def _workload(session: Session, body: PlanRequest) -> Workload:
    if body.workload is not None:
        return workload_from_dict(body.workload, "workload")
    samples = read_plan_demand(session, datetime.now(UTC), body.window_s)
    return workload_from_usage(samples, body.window_s)
