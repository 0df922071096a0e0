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


def _tiny_inputs(tmp_path: Path) -> tuple[Path, Path]:
    from tests.twin.profile_helpers import tiny_profile_dict

    profile = tmp_path / "tiny.json"
    slow = {"fixed_us": 20000.0, "per_decode_seq_us": 500.0, "per_prefill_token_us": 200.0}
    profile.write_text(json.dumps(tiny_profile_dict(**slow)))
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "prompt_tokens: {p50: 40, p90: 80, max: 200}\noutput_tokens: {p50: 20, p90: 40, max: 100}\n"
        "adapters: [{name: a, rank: 8, rate: 20.0, count: 4}]\n"
    )
    return profile, workload


def test_the_search_prints_the_chosen_plan_with_its_margin_and_the_runners_up(tmp_path: Path) -> None:
    profile, workload = _tiny_inputs(tmp_path)
    args = [str(workload), "--profile", str(profile), "--slo", "ttft_p99=500ms", "--samples", "8"]
    args += ["--check-s", "5", "--max-checks", "6", "--gpu-price", "2.5"]
    result = _plan(tmp_path, *args, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verdict"] == "meets SLO" and report["margin_pct"] > 0  # the per-GPU plan's margin too
    search = report["search"]
    chosen = search["chosen"]
    assert search["verdict"] == chosen["verdict"] == "meets SLO" and search["max_checks"] == 6
    assert chosen["measured_s"] <= 0.5 and chosen["margin_pct"] > 0
    assert chosen["cost_per_hour"] == 2.5 * chosen["num_workers"]
    for field in ("max_num_seqs", "memory_mode", "adapter_fraction", "batch_policy", "placement"):
        assert field in chosen
    assert all(r["why"] and r["verdict"] for r in search["runners_up"])
    assert 1 <= search["num_checks"] <= 6
    table = _plan(tmp_path, *args)
    assert table.exit_code == 0, table.output
    assert f"search: chosen {chosen['num_workers']} workers" in table.output
    assert f"margin {chosen['margin_pct']:+.1f}%" in table.output and "why not chosen" in table.output
    assert f"margin {report['margin_pct']:+.1f}% under the SLO" in table.output


def test_a_search_whose_window_holds_no_request_could_not_judge(tmp_path: Path) -> None:
    profile, workload = _tiny_inputs(tmp_path)
    workload.write_text(
        "prompt_tokens: {p50: 40}\noutput_tokens: {p50: 20}\nadapters: [{name: a, rank: 8, rate: 0.001}]\n"
    )
    args = [str(workload), "--profile", str(profile), "--slo", "ttft_p99=500ms", "--samples", "8"]
    result = _plan(tmp_path, *args, "--check-s", "1", "--json")
    assert result.exit_code == 1, result.output  # not "meets SLO"
    report = json.loads(result.output)
    assert report["search"]["verdict"] == "could not judge" and report["search"]["chosen"] is None
    assert report["verdict"] == "could not judge"
