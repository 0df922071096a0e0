"""`plan_workload`: the planner end to end, what `lorahost plan` and POST /v1/admin/plan's jobs
(twin/planner/plan_inputs.py) call: the surrogate from cached (or new) twin training runs, the plan
and its twin check, and optionally the baselines."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from settings import Settings
from settings.engine import EngineSettings
from twin.planner.plan import Planner, PlanOptions, compare_baselines
from twin.planner.search import SearchOptions, search_plans
from twin.planner.surrogate import Surrogate, TrainingConfig, training_samples
from twin.planner.workload import Workload
from twin.profile import TwinProfile


def plan_workload(
    workload: Workload,
    profile: TwinProfile,
    engine: EngineSettings,
    options: PlanOptions | None = None,
    *,
    training: TrainingConfig | None = None,
    cache_dir: Path | None = None,
    with_baselines: bool = False,
    progress: Callable[[int, int], None] | None = None,
    search: SearchOptions | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """The plan as plain values (Plan.as_dict, plus "profile", "train_s" and "baselines" when asked, and
    "search" when `search` is given: the cheapest deployment meeting its SLO in the cluster twin, search.py,
    run with `settings` (default: the default sections around `engine`))."""
    options = options if options is not None else PlanOptions()
    training = training if training is not None else TrainingConfig()
    started = time.perf_counter()
    samples = training_samples(
        profile, engine, training, cache_dir=cache_dir, max_lora_rank=options.max_lora_rank, progress=progress
    )
    surrogate = Surrogate(samples, seed=training.seed)
    train_s = time.perf_counter() - started
    planner = Planner(profile, engine, workload, surrogate, options)
    plan = planner.plan()
    report = plan.as_dict() | {
        "profile": profile.hardware.name + " / " + profile.model.name,
        "train_s": round(train_s, 3),
    }
    report["margin_pct"] = _margin_pct(report, options)
    if with_baselines:
        report["baselines"] = [b.as_dict() for b in compare_baselines(planner, plan.num_gpus)]
    if search is not None:
        cluster = settings if settings is not None else Settings.model_construct(engine=engine)
        report["search"] = search_plans(workload, profile, cluster, search).as_dict()
    return report


def _margin_pct(report: dict[str, Any], options: PlanOptions) -> float | None:
    """The per-GPU plan's headroom under the SLO in the twin, in percent of it (its worst GPU; None without an
    SLO or when no GPU's window held a request)."""
    slo = options.slo
    judged = [g["twin"] for g in report["gpus"] if g["twin"] is not None and g["twin"]["num_requests"] > 0]
    if slo is None or not judged:
        return None
    worst = max(float(t[slo.summary_field]) for t in judged)
    return round(100.0 * (slo.max_s - worst) / slo.max_s, 1)
