"""A capacity-plan job's inputs as plain JSON values, and the run that turns them into the answer.

POST /v1/admin/plan resolves and checks everything in the request (profile, SLO, workload or recorded demand)
and stores `plan_inputs(...)` on the job row; the job (a child process or a Celery task: jobs/plan_runner.py)
calls `run_plan_inputs`, which needs no DB, and returns exactly the body the synchronous route used to answer
(`lorahost plan --json`'s plan with "object" and "window_s").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from settings.engine import EngineSettings
from twin.planner.plan import PlanOptions
from twin.planner.run_planner import plan_workload
from twin.planner.search import SearchOptions
from twin.planner.slo import Slo
from twin.planner.surrogate import TrainingConfig
from twin.planner.workload import Workload, workload_from_dict
from twin.profile import TwinProfile, profile_from_dict


def plan_inputs(
    workload: Workload,
    profile: TwinProfile,
    slo: Slo | None,
    *,
    objective: str,
    form: str,
    check_s: float,
    num_samples: int,
    with_baselines: bool,
    window_s: float | None,
    max_lora_rank: int,
    search: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checked inputs as JSON values (the profile's and workload's content, the SLO's fields); `search`:
    the search's budget and price (`search_inputs`), None for no search."""
    return {
        "workload": workload.model_dump(mode="json"),
        "profile": profile.to_dict(),
        "slo": None if slo is None else {"metric": slo.metric, "max_s": slo.max_s},
        "objective": objective,
        "form": form,
        "check_s": check_s,
        "num_samples": num_samples,
        "baselines": with_baselines,
        "window_s": window_s,
        "max_lora_rank": max_lora_rank,
        "search": search,
    }


def search_inputs(max_checks: int, max_search_s: float, price_per_gpu_hour: float) -> dict[str, Any] | None:
    """The search's inputs as JSON values; None (no search) when `max_checks` is 0."""
    if max_checks <= 0:
        return None
    return {"max_checks": max_checks, "max_search_s": max_search_s, "price_per_gpu_hour": price_per_gpu_hour}


def run_plan_inputs(inputs: dict[str, Any], engine: EngineSettings, cache_dir: Path) -> dict[str, Any]:
    """Plan (and twin-check) the stored inputs; the API's answer body. CPU-bound: seconds to minutes."""
    options = PlanOptions(
        slo=Slo(**inputs["slo"]) if inputs["slo"] else None,
        objective=inputs["objective"],
        form=inputs["form"],
        check_duration_s=inputs["check_s"],
        max_lora_rank=inputs["max_lora_rank"],
    )
    search = inputs.get("search")  # absent in a job stored before the search
    report = plan_workload(
        workload_from_dict(inputs["workload"], "workload"),
        profile_from_dict(inputs["profile"], "profile"),
        engine,
        options,
        training=TrainingConfig(num_samples=inputs["num_samples"]),
        cache_dir=cache_dir,
        with_baselines=inputs["baselines"],
        search=None
        if not search or options.slo is None
        else SearchOptions(options.slo, window_s=options.check_duration_s, **search),
    )
    return {"object": "capacity_plan", "window_s": inputs["window_s"]} | report
