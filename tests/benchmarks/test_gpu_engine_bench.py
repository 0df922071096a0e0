"""benchmarks/gpu_engine_bench.py: the workload's definitions, the report's rows and ratios, and its CPU smoke
run end to end (the table and the JSON's structure; no speed is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from gpu_engine_report import build_rows, format_table, planned_rows
from gpu_engine_workload import SHAPES, adapter_rank, adapter_set_bytes, batch_adapters, timed_runs
from random_weights import base_weight_shapes, random_base_weights

WORKLOAD = {"batch": 4, "prompt_len": 8, "max_tokens": 4}


def test_requests_take_adapters_round_robin() -> None:
    assert batch_adapters(0, 4) == []
    assert batch_adapters(2, 5) == [0, 1, 0, 1, 0]
    assert batch_adapters(256, 4) == [0, 1, 2, 3]


def test_adapter_sets_of_the_8b_shape_fit_an_h100_beside_the_weights() -> None:
    """Ranks 8..128 for the first 64 adapters, 8..32 after: 256 adapters are 35 GB, not 66 GB."""
    assert [adapter_rank(i) for i in range(6)] == [8, 16, 32, 64, 128, 8]
    assert {adapter_rank(i) for i in range(64, 256)} == {8, 16, 32}
    cfg = SHAPES["8b"].hf_config()
    sizes_gb = [round(adapter_set_bytes(cfg, n, 2) / 1e9, 2) for n in (16, 64, 256)]
    assert sizes_gb == [3.94, 16.23, 35.02]


def test_a_timed_run_that_would_end_past_the_row_limit_is_not_started() -> None:
    now = [0.0]
    lengths: list[int] = []

    def run(max_tokens: int) -> dict:
        lengths.append(max_tokens)
        now[0] += 10.0
        return {"total_s": 10.0}

    runs = timed_runs(run, max_tokens=16, warmup_tokens=2, repeats=5, max_row_s=25.0, clock=lambda: now[0])
    assert lengths == [2, 16, 16]  # warm-up, then a second run ends at 20 s, a third would end at 30 s
    assert len(runs) == 2


def test_random_weights_name_every_tensor_of_transformers_llama_and_repeat_with_the_seed() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = SHAPES["tiny"].hf_config()
    hf_shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(LlamaConfig(**cfg)).state_dict().items()}
    assert dict(base_weight_shapes(cfg)) == hf_shapes
    first = dict(random_base_weights(cfg, torch.float32, torch.device("cpu"), seed=3))
    second = dict(random_base_weights(cfg, torch.float32, torch.device("cpu"), seed=3))
    assert all(torch.equal(first[k], second[k]) for k in first)


def _line(system: str, num_adapters: int, tok_s: float, step_ms: float) -> dict:
    return {
        "system": system,
        "model": "tiny",
        "num_adapters": num_adapters,
        "out_tok_s": tok_s,
        "decode_step_ms_median": step_ms,
        "device_name": "NVIDIA H100 80GB HBM3",
        "dtype": "float32",
    }


def test_rows_carry_ratios_to_own_base_and_to_transformers_and_say_why_one_is_missing() -> None:
    plan = planned_rows(["tiny"], [2], ["lorahost", "hf"])
    lines = [_line("lorahost", 0, 400.0, 2.0), _line("hf", 0, 200.0, 4.0), _line("lorahost", 2, 300.0, 3.0)]
    rows = build_rows(lines, plan, WORKLOAD, 1e9, {("tiny", "hf"): "time limit 60s"})
    by_key = {(r["num_adapters"], r["system"]): r for r in rows}
    assert by_key[(2, "lorahost")]["vs_base"] == 0.75
    assert by_key[(0, "lorahost")]["vs_hf"] == 2.0
    assert by_key[(2, "lorahost")]["vs_hf"] is None
    assert by_key[(2, "hf")]["error"] == "time limit 60s"
    floor = by_key[(0, "lorahost")]["floor_ms"]
    assert by_key[(0, "lorahost")]["vs_floor"] == round(2.0 / floor, 3)
    assert by_key[(2, "lorahost")]["floor_ms"] > floor  # the batch's adapters are read too
    table = format_table(rows).splitlines()
    assert len(table) == 1 + len(plan)
    assert "(time limit 60s)" in table[-1]


@pytest.mark.slow
def test_smoke_run_prints_one_table_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "gpu_engine.json"
    cmd = [sys.executable, str(BENCH / "gpu_engine_bench.py"), "--smoke", "--out", str(out)]
    proc = subprocess.run(
        [*cmd, "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    plan = planned_rows(["tiny"], [2, 8], ["lorahost", "hf"])
    assert [(r["model"], r["num_adapters"], r["system"]) for r in report["rows"]] == plan
    for row in report["rows"]:
        assert "error" not in row
        assert row["tok_s"] > 0 and row["step_ms"] > 0 and row["floor_ms"] > 0 and row["vs_floor"] > 0
        assert row["device_name"].startswith("CPU")
        assert row["vs_base"] is not None
        assert row["system"] == "hf" or row["vs_hf"] is not None
        # one model, one set of adapters, in fp32: the same greedy tokens
        assert row["system"] == "hf" or row["same_first_tokens_as_hf"]
    lorahost_8 = next(r for r in report["rows"] if r["num_adapters"] == 8 and r["system"] == "lorahost")
    assert lorahost_8["line"]["num_adapters_loaded"] == 8 and lorahost_8["num_distinct"] == 4
    hf_8 = next(r for r in report["rows"] if r["num_adapters"] == 8 and r["system"] == "hf")
    assert hf_8["line"]["num_adapters_loaded"] == 4  # peft holds the batch's adapters only
    assert set(report["kernel_choices"]["tiny"]["forms"]) >= {"decode_attention", "decode_lora"}
    assert report["card"].startswith("CPU") and report["bandwidth_bytes_per_s"] > 0
    table = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("model"))
    columns = ("tok/s", "step ms", "vs base", "vs hf", "floor ms", "vs floor", "card")
    assert all(c in table[header] for c in columns)
    assert len([line for line in table[header + 1 :] if line.startswith("tiny ")]) == len(plan)
