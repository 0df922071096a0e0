"""`lorahost tune` on the tiny model: it measures each op's candidates with the worker's settings, caches the
choices where a worker reads them (so the worker's start measures nothing), re-measures on --retune, keeps a
forced setting, and refuses a directory that is not a model."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from lorahost.cli import app

ENV = {
    "LORAHOST_ENGINE_NUM_KV_BLOCKS": "64",
    "LORAHOST_ENGINE_NUM_THREADS": "1",
    "LORAHOST_ENGINE_DTYPE": "float32",
}


def _tune(tmp_path: Path, *args: str, **env: str):  # type: ignore[no-untyped-def]
    full_env = {**ENV, "LORAHOST_DATA_DIR": str(tmp_path / "data"), **env}
    full_env["LORAHOST_ENGINE_KERNEL_CHOICES_PATH"] = str(tmp_path / "choices.json")
    return CliRunner().invoke(app, ["tune", *args], env=full_env)


def test_tune_measures_caches_and_a_worker_start_measures_nothing(
    base_model_dir: Path, tmp_path: Path
) -> None:
    from gpu_workers.engine.config import EngineConfig
    from gpu_workers.engine.llm_engine import LLMEngine

    first = _tune(tmp_path, "--base-model", str(base_model_dir), "--json")
    assert first.exit_code == 0, first.output
    report = json.loads(first.output)
    assert report["machine"]["threads"] == "1" and report["cache"] == str(tmp_path / "choices.json")
    assert set(report["plan"]) == {
        "linear_weights",
        "prefill_gemm",
        "decode_attention",
        "decode_lora",
        "prefill_attention",
        "decode_step",
    }
    attention = report["choices"]["decode_attention"]
    assert attention["source"] == "measured" and attention["choice"] in attention["ms"]
    assert all(ms > 0 for ms in attention["ms"].values())
    assert report["tuner_s"] > 0
    assert "CUDA" in report["choices"]["decode_lora"]["skipped"]["sgmv"]  # a CPU worker: no Triton forms

    again = json.loads(_tune(tmp_path, "--base-model", str(base_model_dir), "--json").output)
    assert again["tuner_s"] == 0.0 and again["plan"] == report["plan"]
    assert {c["source"] for c in again["choices"].values()} == {"cached"}

    engine = LLMEngine(
        EngineConfig(
            model_path=base_model_dir,
            dtype="float32",
            num_kv_blocks=64,
            num_threads=1,
            kernel_choices_path=tmp_path / "choices.json",
        )
    )
    stats = engine.runner_stats()
    assert stats.kernel_tuner_s == 0.0
    assert stats.kernel_choices == report["plan"]

    retuned = json.loads(_tune(tmp_path, "--base-model", str(base_model_dir), "--json", "--retune").output)
    assert retuned["choices"]["decode_attention"]["source"] == "measured"


def test_tune_keeps_a_forced_form_and_prints_a_table(base_model_dir: Path, tmp_path: Path) -> None:
    result = _tune(
        tmp_path, "--base-model", str(base_model_dir), LORAHOST_ENGINE_DECODE_ATTENTION="grouped_matmul"
    )
    assert result.exit_code == 0, result.output
    assert (
        "decode_attention" in result.output
        and "grouped_matmul" in result.output
        and "forced" in result.output
    )
    assert "decode_lora: bgmv is no candidate here" in result.output


def test_tune_refuses_a_directory_without_a_model(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = _tune(tmp_path, "--base-model", str(tmp_path / "empty"))
    assert result.exit_code != 0
    assert "config.json" in result.output
