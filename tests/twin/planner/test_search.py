"""The planner's search on a tiny profile of slow round steps (a worker serves ~37 requests/s): it chooses the
fewest workers some setup meets the SLO with in the cluster twin, each check with its margin; an empty check
window is "could not judge", never "meets SLO"; the budget bounds the twin checks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from settings import Settings
from tests.twin.profile_helpers import tiny_profile
from twin.planner.cluster_check import MEETS, MISSES, NOT_JUDGED, candidate_settings, check_candidate
from twin.planner.gpu_run import GpuOutcome
from twin.planner.plan import Plan, PlannedGpu
from twin.planner.search import SearchOptions, search_plans
from twin.planner.search_space import NO_PLACEMENT, Candidate, estimate
from twin.planner.slo import parse_slo
from twin.planner.workload import Workload, workload_from_dict
from twin.profile import TwinProfile

SLOW_STEPS = {"fixed_us": 20000.0, "per_decode_seq_us": 500.0, "per_prefill_token_us": 200.0}
LENGTHS = {
    "prompt_tokens": {"p50": 40, "p90": 80, "max": 200},
    "output_tokens": {"p50": 20, "p90": 40, "max": 100},
}
SLO = parse_slo("ttft_p99=500ms")


@pytest.fixture(scope="module")
def profile() -> TwinProfile:
    return tiny_profile(**SLOW_STEPS)


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings.model_construct()


def _workload(rate: float, count: int = 4) -> Workload:
    return workload_from_dict(
        {**LENGTHS, "adapters": [{"name": "a", "rank": 8, "rate": rate, "count": count}]}
    )


def _options(**changes: object) -> SearchOptions:
    return replace(SearchOptions(SLO, window_s=5.0, warmup_s=1.0), **changes)  # type: ignore[arg-type]


def test_the_search_chooses_the_fewest_workers_that_meet_the_slo(
    profile: TwinProfile, settings: Settings
) -> None:
    workload = _workload(20.0)  # 80 requests/s: more than one worker serves
    result = search_plans(workload, profile, settings, _options())
    assert result.verdict == MEETS and result.chosen is not None
    chosen = result.chosen
    assert chosen.outcome.verdict == MEETS and chosen.outcome.num_requests > 0
    assert chosen.outcome.measured_s <= SLO.max_s and (chosen.outcome.margin_pct or 0.0) > 0
    fewer = [c for c in result.checks if c.candidate.num_workers < chosen.candidate.num_workers]
    assert all(c.outcome.verdict == MISSES for c in fewer)
    # the chosen setup on one worker fewer misses the SLO in the twin: no cheaper plan of it exists
    cheaper = replace(chosen.candidate, num_workers=chosen.candidate.num_workers - 1)
    if cheaper.num_workers >= 1:
        outcome = check_candidate(cheaper, workload, profile, settings, SLO, window_s=5.0, warmup_s=1.0)
        assert outcome.verdict == MISSES
    report = result.as_dict()
    assert report["chosen"]["num_workers"] == chosen.candidate.num_workers
    assert report["chosen"]["margin_pct"] == pytest.approx(chosen.outcome.margin_pct, abs=0.1)
    assert report["num_checks"] == len(result.checks) <= report["max_checks"]
    assert all(r["why"] for r in report["runners_up"])


def test_a_light_workload_needs_one_worker_with_the_deployments_own_setup(
    profile: TwinProfile, settings: Settings
) -> None:
    result = search_plans(_workload(1.0), profile, settings, _options())
    assert result.chosen is not None and result.chosen.candidate.num_workers == 1
    assert len(result.checks) == 1  # the reference setup passed at once
    engine = settings.engine
    assert (result.chosen.candidate.max_num_seqs, result.chosen.candidate.batch_policy) == (
        engine.max_num_seqs,
        engine.batch_policy,
    )


def test_an_empty_check_window_could_not_judge(profile: TwinProfile, settings: Settings) -> None:
    rare = _workload(0.001, count=1)  # no request in a 1 s window (seeded)
    result = search_plans(rare, profile, settings, _options(window_s=1.0))
    assert result.verdict == NOT_JUDGED and result.chosen is None and not result.checks
    assert "holds no request" in " ".join(result.notes)
    candidate = Candidate(1, 64, "unified", None, "fifo", NO_PLACEMENT)
    outcome = check_candidate(candidate, rare, profile, settings, SLO, window_s=1.0, warmup_s=1.0)
    assert outcome.num_requests == 0 and outcome.verdict == NOT_JUDGED and outcome.margin_pct is None
    assert outcome.as_dict()["verdict"] == "could not judge"


def test_a_per_gpu_plan_whose_windows_hold_no_request_says_it_could_not_judge() -> None:
    empty = GpuOutcome(0.0, 0.0, 0.0, False, False, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
    plan = Plan([PlannedGpu((), 0, 1, None, empty)], SLO, "throughput", 1, 0.0, 0.0, 0)
    assert plan.is_twin_ok  # the old field is kept; the verdict says what it means
    assert plan.as_dict()["verdict"] == "could not judge" and plan.as_dict()["num_unjudged_gpus"] == 1
    judged = replace(empty, num_requests=3)
    assert Plan([PlannedGpu((), 0, 1, None, judged)], SLO, "throughput", 1, 0.0, 0.0, 0).verdict == MEETS


def test_the_budget_bounds_the_twin_checks(profile: TwinProfile, settings: Settings) -> None:
    impossible = _options(slo=parse_slo("ttft_p99=1ms"), max_checks=2)
    result = search_plans(_workload(20.0), profile, settings, impossible)
    assert len(result.checks) == 2 and result.is_budget_exhausted and result.chosen is None
    assert result.verdict == "no plan meets the SLO" and "budget spent" in " ".join(result.notes)
    timed = search_plans(_workload(20.0), profile, settings, _options(max_search_s=1e-9))
    assert not timed.checks and timed.is_budget_exhausted


def test_the_estimate_prunes_what_cannot_fit_or_keep_up(profile: TwinProfile, settings: Settings) -> None:
    workload = _workload(20.0)
    one = Candidate(1, 64, "unified", None, "fifo", NO_PLACEMENT)
    assert estimate(one, profile, settings.engine, workload).pruned == "load"  # 80 req/s on one worker
    assert not estimate(replace(one, num_workers=3), profile, settings.engine, workload).pruned
    no_kv = replace(one, num_workers=3, memory_mode="static", adapter_fraction=0.999)
    assert estimate(no_kv, profile, settings.engine, workload).pruned == "memory"


def test_a_candidates_settings_are_what_the_cluster_twin_runs(
    profile: TwinProfile, settings: Settings
) -> None:
    candidate = Candidate(3, 128, "static", 0.1, "multiqueue", "contiguous")
    built = candidate_settings(candidate, settings, profile, warmup_s=2.0)
    assert (built.engine.max_num_seqs, built.engine.memory_mode, built.engine.batch_policy) == (
        128,
        "static",
        "multiqueue",
    )
    assert built.engine.adapter_cache_bytes == int(0.1 * profile.memory.device_bytes)
    assert (built.placement.policy, built.jobs.placement_interval_s, built.placement.bucket_s) == (
        "contiguous",
        2.0,
        2.0,
    )
    free = candidate_settings(replace(candidate, placement=NO_PLACEMENT), settings, profile, warmup_s=2.0)
    assert free.jobs.placement_interval_s == 0 and free.placement.policy == NO_PLACEMENT
    assert free.routing.policy == settings.routing.policy  # the configured router, alone
