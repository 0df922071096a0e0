"""benchmarks/twin_fidelity.py end to end on the tiny model: both systems replay the same trace, every request
finishes once on each, and the output carries one SMAPE per compared metric (no threshold on their values:
fidelity is measured and reported, not asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.twin.profile_helpers import tiny_profile_dict
from twin.profile import profile_from_dict
from twin.run_metrics import COMPARED

pytestmark = pytest.mark.slow  # runs the real engine and the twin on the same trace

REPO = Path(__file__).resolve().parents[2]
CONV = REPO.parent / "shared" / "data" / "azure_llm_2023_conv.csv"


@pytest.fixture
def twin_fidelity():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import twin_fidelity

        yield twin_fidelity
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_the_real_engine_and_the_twin_replay_one_trace_and_are_compared(
    twin_fidelity, demo_dir: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    profile = tmp_path / "tiny-twin.json"
    profile.write_text(json.dumps(profile_from_dict(tiny_profile_dict()).to_dict()))
    out = tmp_path / "fidelity.json"
    traces = "conv,long" if CONV.exists() else "long"
    argv = [
        "--model-dir", str(demo_dir), "--profile", str(profile), "--conv-trace", str(CONV), "--traces", traces,
        "--loads", "0.5", "--policies", "fifo", "--memory-modes", "unified", "--num-adapters", "2",
        "--bounds", "slot,memory", "--num-requests", "6", "--max-prompt", "64", "--max-output", "8",
        "--threads", "1", "--dtype", "float32", "--output", str(out), "--repeats", "2",
    ]  # fmt: skip
    assert twin_fidelity.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * len(traces.split(","))
    for row in rows:
        assert row["real"]["num_finished"] == row["twin"]["num_finished"] == 6
        # two fresh real runs, each whole; the twin is scored against their median
        assert [run["num_finished"] for run in row["real_runs"]] == [6, 6]
        ttfts = sorted(run["ttft_p50_s"] for run in row["real_runs"])
        assert row["real"]["ttft_p50_s"] == pytest.approx(sum(ttfts) / 2)
        assert len(row["smape_per_run_pct"]) == 2 and set(row["real_spread_pct"]) == set(COMPARED)
        assert set(row["smape_pct"]) == set(COMPARED)
        assert all(0.0 <= v <= 200.0 for v in row["smape_pct"].values())
        assert row["twin_sim_s_per_wall_s"] > 0


def test_long_inputs_are_long_and_arrivals_follow_the_rate(twin_fidelity) -> None:  # type: ignore[no-untyped-def]
    sizes = twin_fidelity.lengths("long", 200, max_prompt=512, max_output=64, seed=1)
    assert all(256 <= p <= 512 and 4 <= o <= 16 for p, o in sizes)
    trace = twin_fidelity.make_trace(sizes, ["a", "b"], rate=10.0, seed=1)
    assert trace[-1].arrival_s == pytest.approx(20.0, rel=0.25)  # 200 Poisson arrivals at 10/s
    assert [r.arrival_s for r in trace] == sorted(r.arrival_s for r in trace)
