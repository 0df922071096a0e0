"""Workload files: the example loads, bad ones fail naming the field; the seeded Poisson trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from twin.planner.recorded_demand import UsageSample, workload_from_usage
from twin.planner.workload import WorkloadError, load_workload, workload_from_dict
from twin.planner.workload_trace import generate_trace

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "plan-workload.yaml"
LENGTHS = {"prompt_tokens": {"p50": 100, "p90": 300}, "output_tokens": {"p50": 50}}


def test_the_example_workload_loads_and_unrolls_groups() -> None:
    workload = load_workload(EXAMPLE)
    ids = [a.adapter_id for a in workload.expanded()]
    groups = [a for a in workload.adapters if a.count > 1]
    assert len(ids) == sum(a.count for a in workload.adapters) and len(set(ids)) == len(ids)
    assert f"{groups[0].name}-0" in ids and f"{groups[0].name}-{groups[0].count - 1}" in ids


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**LENGTHS, "adapters": []}, "adapters"),
        ({**LENGTHS, "adapters": [{"name": "a", "rank": 0, "rate": 1}]}, "adapters.0.rank"),
        ({**LENGTHS, "adapters": [{"name": "a", "rank": 8, "rate": 1}] * 2}, "adapter names repeat"),
        ({**LENGTHS, "adapters": [{"name": "a", "rank": 8, "rate": 0}]}, "rate 0"),
        (
            {"prompt_tokens": {"p50": 100, "p90": 50}, "output_tokens": {"p50": 5}, "adapters": []},
            "below p50",
        ),
        ({**LENGTHS, "adapters": [{"name": "a", "rank": 8, "rate": 1, "colour": "red"}]}, "colour"),
        ([1, 2], "a workload is a mapping"),
    ],
)
def test_a_bad_workload_names_what_to_fix(data: object, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        workload_from_dict(data, "w.yaml")


def test_unreadable_and_malformed_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("adapters: [unclosed\n")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        load_workload(bad)


def test_the_trace_is_seeded_poisson_at_the_adapters_rates() -> None:
    workload = workload_from_dict(
        {
            **LENGTHS,
            "adapters": [{"name": "hot", "rank": 8, "rate": 20.0}, {"name": "cold", "rank": 8, "rate": 2.0}],
        }
    )
    adapters = workload.expanded()
    trace = generate_trace(workload, adapters, 100.0, seed=3)
    assert trace == generate_trace(workload, adapters, 100.0, seed=3)
    assert trace != generate_trace(workload, adapters, 100.0, seed=4)
    hot = sum(r.adapter_id == "hot" for r in trace)
    cold = sum(r.adapter_id == "cold" for r in trace)
    assert 1800 < hot < 2200 and 140 < cold < 260  # Poisson: mean 2000 / 200, sd 45 / 14
    assert all(0 <= r.arrival_s < 100 for r in trace)
    assert [r.arrival_s for r in trace] == sorted(r.arrival_s for r in trace)
    assert all(r.num_output_tokens == 50 for r in trace)  # no p90: a fixed length
    assert all(1 <= r.num_prompt_tokens <= workload.prompt_tokens.upper for r in trace)


def test_recorded_usage_becomes_rates_and_length_percentiles() -> None:
    samples = [UsageSample("v1", 16, "t", 100 + i, 10) for i in range(30)] + [
        UsageSample("v2", 8, None, 50, 20)
    ]
    workload = workload_from_usage([*samples, UsageSample("base", 0, None, 5, 5)], window_s=60.0)
    rates = {a.name: a.rate for a in workload.adapters}
    assert rates == {"v1": 30 / 60.0, "v2": 1 / 60.0}  # the base-model row (rank 0) is no adapter
    assert workload.output_tokens.p50 == 10 and workload.prompt_tokens.max == 129
    with pytest.raises(ValueError, match="no adapter request"):
        workload_from_usage([UsageSample("base", 0, None, 5, 5)], window_s=60.0)
