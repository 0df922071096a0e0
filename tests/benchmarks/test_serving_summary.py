"""benchmarks/serving.py's runs and summary: "lorahost" once per engine, and the ratios between the systems
(lorahost against bare vLLM, vLLM behind lorahost's worker against bare vLLM, the two engines)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from serving import expand_systems
from serving_client import request_body
from serving_metrics import summary_line
from serving_workload import WorkloadRequest


def test_lorahost_runs_once_per_engine() -> None:
    assert expand_systems("lorahost,vllm", "native,vllm") == ["lorahost", "lorahost-vllm", "vllm"]
    assert expand_systems("lorahost", "native") == ["lorahost"]
    assert expand_systems("vllm", "native,vllm") == ["vllm"]


def test_the_summary_compares_each_pair_that_ran() -> None:
    common = {"run_id": "r"}
    results = {
        "lorahost": {"ttft_ms_p50": 50.0, "goodput_rps": 0.3},
        "lorahost-vllm": {"ttft_ms_p50": 200.0, "goodput_rps": 0.1},
        "vllm": {"ttft_ms_p50": 100.0, "goodput_rps": 0.2},
    }
    summary = summary_line(common, results)
    assert summary["ttft_p50_lorahost_vs_vllm"] == 0.5
    assert summary["ttft_p50_lorahost-vllm_vs_vllm"] == 2.0
    assert summary["ttft_p50_lorahost_vs_lorahost-vllm"] == 0.25
    assert summary["goodput_lorahost-vllm_vs_vllm"] == 0.5
    assert summary["lorahost-vllm_ttft_ms_p50"] == 200.0
    partial = summary_line(common, {"lorahost": results["lorahost"], "vllm": None})
    assert not any("_vs_" in key for key in partial)


def test_every_system_gets_the_same_request() -> None:
    request = WorkloadRequest(0, 0.0, "a", 2, 5, 2, 5, prompt="hi", prompt_token_ids=[1, 7])
    bodies = [request_body(system, request, "text") for system in ("lorahost", "lorahost-vllm", "vllm")]
    assert bodies[0] == bodies[1] == bodies[2]
    assert bodies[0]["ignore_eos"] is True and bodies[0]["min_tokens"] == 5
