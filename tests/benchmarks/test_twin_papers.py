"""benchmarks/twin_papers.py on its smallest cases: every section runs with the H100 profile and returns a
table of finite twin values, every request of every run finishes exactly once, and the compared runs replay
the same trace (no speed threshold)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from benchmarks import twin_papers as tp
from twin.profile import load_profile
from twin.request_record import RequestRecord
from twin.trace import TraceRequest

pytestmark = pytest.mark.slow  # every paper section runs the cluster twin


@pytest.fixture(scope="module", autouse=True)
def conv_trace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Azure conversation trace, or (a checkout without ../shared/data) a synthetic one of its shape."""
    if tp.CONV_TRACE.exists():
        yield tp.CONV_TRACE
        return
    saved = tp.CONV_TRACE
    tp.CONV_TRACE = _synthetic_trace(tmp_path_factory.mktemp("trace") / "conv.csv")
    try:
        yield tp.CONV_TRACE
    finally:
        tp.CONV_TRACE = saved


def _synthetic_trace(path: Path, num_rows: int = 3000) -> Path:
    """A CSV in the Azure trace's format: Poisson arrivals, log-normal lengths (medians ~1020 / ~130)."""
    rng = random.Random(14)
    lines, t = ["TIMESTAMP,ContextTokens,GeneratedTokens"], 0.0
    for _ in range(num_rows):
        t += rng.expovariate(5.0)
        stamp = (datetime(2023, 11, 16, 18) + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f")
        context = max(1, min(8000, round(1020 * math.exp(rng.gauss(0.0, 0.9)))))
        lines.append(f"{stamp},{context},{max(1, min(2000, round(130 * math.exp(rng.gauss(0.0, 0.8)))))}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    output = tmp_path_factory.mktemp("twin_papers") / "out.json"
    result = tp.run(["--quick", "--output", str(output)])
    assert json.loads(output.read_text()) == json.loads(json.dumps(result))
    return result


def test_every_section_prints_a_table_of_finite_values_beside_the_papers(quick: dict) -> None:  # type: ignore[type-arg]
    assert [s["name"] for s in quick["sections"]] == list(tp.SECTIONS)
    assert quick["meta"]["profile"] == tp.DEFAULT_PROFILE.name and quick["meta"]["sources"]
    for section in quick["sections"]:
        assert section["rows"] and section["runs"], section["name"]
        assert all(math.isfinite(row["twin"]) for row in section["rows"]), section["name"]
        assert any(row["paper"] is not None for row in section["rows"]), section["name"]


def test_fifo_and_multiqueue_replay_the_same_trace(quick: dict) -> None:  # type: ignore[type-arg]
    [chameleon] = [s for s in quick["sections"] if s["name"] == "chameleon"]
    by_point: dict[tuple[int, float], dict[str, str]] = {}
    for run in chameleon["runs"]:
        by_point.setdefault((run["seed"], run["load"]), {})[run["policy"]] = run["trace_fingerprint"]
    assert by_point
    for policies in by_point.values():
        assert set(policies) == set(tp.CHAMELEON_CONFIGS) and len(set(policies.values())) == 1


def test_a_worker_run_finishes_every_request_once_under_every_compared_config() -> None:
    profile = tp.with_device_bytes(load_profile(tp.DEFAULT_PROFILE), tp.CHAMELEON_DEVICE_BYTES)
    adapters = tp.make_adapters(profile, [8, 64, 128])
    trace = tp.poisson_trace(tp.conv_lengths(40, 0), [a.adapter_id for a in adapters], 5.0, 0)
    for policy, sizing, is_cached in tp.CHAMELEON_CONFIGS.values():
        run = tp.run_worker(profile, tp.chameleon_engine(policy, sizing, is_cached), adapters, trace)
        tp.check_run(trace, run.records)
        assert [r.request_id for r in run.records] == [r.request_id for r in trace]
        assert run.stats.num_finished == len(trace)


def test_check_run_refuses_a_missing_a_duplicated_or_an_unfinished_request() -> None:
    trace = [TraceRequest("a", 0.0, 4, 2), TraceRequest("b", 0.1, 4, 1)]
    done = RequestRecord("a", 0.0, 4, finish_s=1.0, token_times=[0.5, 1.0])
    other = RequestRecord("b", 0.1, 4, finish_s=1.0, token_times=[1.0])
    tp.check_run(trace, [done, other])
    with pytest.raises(AssertionError):
        tp.check_run(trace, [done])
    with pytest.raises(AssertionError):
        tp.check_run(trace, [done, done])
    with pytest.raises(AssertionError):
        tp.check_run(trace, [RequestRecord("a", 0.0, 4, token_times=[0.5]), other])


def test_at_rate_keeps_the_requests_and_changes_only_the_arrivals() -> None:
    trace = tp.poisson_trace(tp.conv_lengths(50, 1), ["x", "y"], 1.0, 1)
    faster = tp.at_rate(trace, 10.0, 1)
    assert [(r.request_id, r.num_prompt_tokens, r.num_output_tokens, r.adapter_id) for r in faster] == [
        (r.request_id, r.num_prompt_tokens, r.num_output_tokens, r.adapter_id) for r in trace
    ]
    assert faster[-1].arrival_s < trace[-1].arrival_s
    assert tp.fingerprint(faster) != tp.fingerprint(trace) and tp.fingerprint(trace) == tp.fingerprint(
        list(trace)
    )


def test_the_conversation_trace_path_resolves_from_a_worktree(conv_trace: Path) -> None:
    assert conv_trace.exists() and tp.CONV_TRACE == conv_trace


def test_seeds_option_replaces_the_scales_seeds() -> None:
    result = tp.run(["--quick", "--sections", "chameleon", "--seeds", "3"])
    assert result["meta"]["seeds"] == [3]
    [chameleon] = result["sections"]
    assert {run["seed"] for run in chameleon["runs"]} == {3} and "seeds [3]" in chameleon["setup"]
