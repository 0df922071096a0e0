"""Plans on the shipped H100 profile with a surrogate trained on a few short twin runs: every plan returned is
re-run in the twin and neither starves nor overflows there (whatever the surrogate got wrong); baselines."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from settings.engine import EngineSettings
from tests.twin.planner.conftest import SMALL_TRAINING
from twin.planner.gpu_run import GpuSetup, run_gpu
from twin.planner.memory_check import check_memory
from twin.planner.plan import Planner, PlanOptions, compare_baselines
from twin.planner.run_planner import plan_workload
from twin.planner.slo import parse_slo
from twin.planner.surrogate import Prediction, Surrogate, TrainingConfig, training_samples
from twin.planner.workload import Workload, workload_from_dict
from twin.profile import TwinProfile

pytestmark = pytest.mark.slow  # each plan is checked in the twin (many simulated runs)

SHORT = {
    "prompt_tokens": {"p50": 200, "p90": 600, "max": 2000},
    "output_tokens": {"p50": 60, "p90": 200, "max": 500},
}
FAST = PlanOptions(check_duration_s=5.0)


def _workload(adapters: list[dict[str, object]]) -> Workload:
    return workload_from_dict({**SHORT, "adapters": adapters})


def _assert_twin_ok(planner: Planner, profile: TwinProfile) -> None:
    plan = planner.plan()
    assert plan.is_twin_ok, plan.as_dict()
    placed = sorted(a.adapter_id for g in plan.gpus for a in g.adapters)
    assert set(placed) == {a.adapter_id for a in planner.workload.expanded()}
    for gpu in plan.gpus:
        assert gpu.twin is not None and not gpu.twin.is_starved and not gpu.twin.is_memory_overflow
        assert check_memory(profile, planner.workload, gpu.adapters, gpu.cache_bytes).is_fitting
    for adapter in planner.workload.expanded():  # a split adapter's shares add up to its rate
        shares = [a.rate for g in plan.gpus for a in g.adapters if a.adapter_id == adapter.adapter_id]
        assert abs(sum(shares) - adapter.rate) < 1e-9


@settings(max_examples=5, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([8, 16, 64]), st.floats(min_value=0.2, max_value=40.0)),
        min_size=1,
        max_size=5,
    )
)
def test_plans_never_starve_or_overflow_in_the_twin(
    h100: TwinProfile, engine: EngineSettings, small_surrogate: Surrogate, adapters: list[tuple[int, float]]
) -> None:
    workload = _workload([{"name": f"a{i}", "rank": r, "rate": rate} for i, (r, rate) in enumerate(adapters)])
    _assert_twin_ok(Planner(h100, engine, workload, small_surrogate, FAST), h100)


def test_an_overloaded_single_adapter_is_split_until_the_twin_agrees(
    h100: TwinProfile, engine: EngineSettings, small_surrogate: Surrogate
) -> None:
    workload = _workload([{"name": "hot", "rank": 16, "rate": 150.0}])
    overloaded = run_gpu(h100, engine, workload, GpuSetup(tuple(workload.expanded()), 10**9), duration_s=5.0)
    assert overloaded.is_starved  # one GPU cannot serve it: the plan needs several
    planner = Planner(h100, engine, workload, small_surrogate, FAST)
    _assert_twin_ok(planner, h100)
    assert planner.plan().num_gpus > 1


def test_a_latency_slo_is_met_in_the_twin(
    h100: TwinProfile, engine: EngineSettings, small_surrogate: Surrogate
) -> None:
    workload = _workload([{"name": f"a{i}", "rank": 16, "rate": 8.0} for i in range(4)])
    options = PlanOptions(check_duration_s=5.0, slo=parse_slo("ttft_p99=300ms"), objective="latency")
    plan = Planner(h100, engine, workload, small_surrogate, options).plan()
    assert plan.is_twin_ok and all(g.twin is not None and g.twin.ttft_p99_s <= 0.3 for g in plan.gpus)


def test_baselines_are_checked_in_the_same_twin(
    h100: TwinProfile, engine: EngineSettings, small_surrogate: Surrogate
) -> None:
    # MaxBase packs every adapter on one GPU (memory allows it) and ignores 4 x 60 req/s of load
    workload = _workload([{"name": f"a{i}", "rank": 8, "rate": 60.0} for i in range(4)])
    planner = Planner(h100, engine, workload, small_surrogate, FAST)
    max_base, random_ = compare_baselines(planner, num_gpus=2)
    assert (max_base.name, max_base.num_gpus, max_base.num_starved) == ("MaxBase", 1, 1)
    assert random_.name == "Random" and random_.num_gpus <= 2 and len(random_.outcomes) == random_.num_gpus


def test_training_runs_are_cached_to_a_file(
    h100: TwinProfile, engine: EngineSettings, tmp_path: Path
) -> None:
    config = TrainingConfig(num_samples=3, duration_s=2.0, seed=5)
    first = training_samples(h100, engine, config, cache_dir=tmp_path)
    [cached] = list(tmp_path.glob("surrogate-*.json"))
    again = training_samples(h100, engine, config, cache_dir=tmp_path)
    assert again == first
    other = training_samples(
        h100, engine, TrainingConfig(num_samples=3, duration_s=2.0, seed=6), cache_dir=tmp_path
    )
    assert other != first and len(list(tmp_path.glob("surrogate-*.json"))) == 2 and cached.is_file()


def test_plan_workload_reports_prediction_twin_and_baselines(
    h100: TwinProfile, engine: EngineSettings, training_dir: Path
) -> None:
    workload = _workload([{"name": "a", "rank": 16, "rate": 5.0}, {"name": "b", "rank": 64, "rate": 2.0}])
    report = plan_workload(
        workload, h100, engine, FAST, training=SMALL_TRAINING, cache_dir=training_dir, with_baselines=True
    )
    assert report["twin_ok"] and report["num_gpus"] == len(report["gpus"]) >= 1
    assert {b["name"] for b in report["baselines"]} == {"MaxBase", "Random"}
    gpu = report["gpus"][0]
    assert (
        gpu["cache_bytes"] > 0
        and gpu["twin"]["throughput_tok_s"] > 0
        and "served_fraction" in gpu["predicted"]
    )


class RefusingSurrogate:
    """Predicts every GPU starved: only the twin can place anything."""

    num_samples = 0

    def predict(self, rows: list[list[float]], form: str = "forest") -> list[Prediction]:
        return [Prediction(0.0, 0.0, 1.0, 99.0) for _ in rows]


def test_the_twin_places_and_consolidates_what_a_too_careful_surrogate_refuses(
    h100: TwinProfile, engine: EngineSettings
) -> None:
    workload = _workload([{"name": f"a{i}", "rank": 8, "rate": 1.0} for i in range(3)])
    planner = Planner(h100, engine, workload, RefusingSurrogate(), FAST)  # type: ignore[arg-type]
    assert len(planner.place()) == 3  # each adapter alone, accepted by a twin run
    plan = planner.plan()
    assert (
        plan.is_twin_ok and plan.num_gpus < 3
    )  # 3 req/s is light for one H100: merged while the twin agrees
    assert any("consolidation" in note for note in plan.notes)
