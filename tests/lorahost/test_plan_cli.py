"""`lorahost plan` on the example workload with the shipped H100 profile (a surrogate of a few short twin runs
to keep it fast): every adapter placed, each GPU checked in the twin; bad inputs are CLI errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lorahost.cli import app

pytestmark = pytest.mark.slow  # the planner trains its surrogate and re-runs plans in the twin

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "plan-workload.yaml"
FAST = ["--samples", "12", "--check-s", "3"]


def _plan(tmp_path: Path, *args: str):  # type: ignore[no-untyped-def]
    env = {"LORAHOST_DATA_DIR": str(tmp_path / "data")}
    return CliRunner().invoke(app, ["plan", *args], env=env)


def test_plan_places_the_example_workload_and_checks_it_in_the_twin(tmp_path: Path) -> None:
    from twin.planner.workload import load_workload

    args = [str(EXAMPLE), "--profile", "h100-llama3.1-8b-vllm", "--slo", "ttft_p99=2s", *FAST]
    result = _plan(tmp_path, *args, "--json", "--baselines")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["twin_ok"] and report["slo"] == "ttft_p99<=2s" and report["num_gpus"] == len(report["gpus"])
    placed = {a["adapter_id"] for g in report["gpus"] for a in g["adapters"]}
    assert placed == {a.adapter_id for a in load_workload(EXAMPLE).expanded()}
    assert all(g["twin"]["ttft_p99_s"] <= 2.0 and not g["twin"]["is_starved"] for g in report["gpus"])
    assert [b["name"] for b in report["baselines"]] == ["MaxBase", "Random"]
    assert list((tmp_path / "data" / "planner").glob("surrogate-*.json"))  # training cached
    table = _plan(tmp_path, *args)
    assert table.exit_code == 0, table.output
    assert f"GPUs needed: {report['num_gpus']}" in table.output and "twin check: OK" in table.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slo", "ttft=fast"], "bad SLO"),
        (["--profile", "no-such-gpu"], "shipped: "),
        (["--objective", "cheapest"], "--objective is throughput or latency"),
    ],
)
def test_bad_options_are_cli_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = _plan(tmp_path, str(EXAMPLE), *args)
    assert result.exit_code == 2 and message in result.output


def test_a_bad_workload_file_is_a_cli_error(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text(
        "prompt_tokens: {p50: 10}\noutput_tokens: {p50: 5}\nadapters: [{name: a, rank: -1, rate: 1}]\n"
    )
    result = _plan(tmp_path, str(bad))
    assert result.exit_code == 2 and "adapters.0.rank" in result.output
