"""`lorahost profile` on the tiny model: it times the engine on a small grid, fits the performance model and
writes a profile file the worker can publish; bad input is a CLI error saying what to change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lorahost.cli import app
from scheduler.routing.perf_model import PerfModel

ENV = {
    "LORAHOST_ENGINE_NUM_KV_BLOCKS": "256",
    "LORAHOST_ENGINE_NUM_THREADS": "1",
    "LORAHOST_ENGINE_DTYPE": "float32",
}


def _invoke(tmp_path: Path, *args: str):  # type: ignore[no-untyped-def]
    env = {**ENV, "LORAHOST_DATA_DIR": str(tmp_path / "data")}
    return CliRunner().invoke(app, ["profile", *args], env=env)


def test_profile_writes_a_fitted_model_the_worker_can_load(base_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "out" / "profile.json"
    result = _invoke(
        tmp_path,
        "--base-model",
        str(base_model_dir),
        "--output",
        str(output),
        "--ranks",
        "4,16",
        "--batch-sizes",
        "1,3",
        "--prompt-tokens",
        "8,24",
        "--decode-steps",
        "2",
        "--repeats",
        "1",
        "--work-dir",
        str(tmp_path / "adapters"),
    )
    assert result.exit_code == 0, result.output
    content = json.loads(output.read_text())
    model = PerfModel.from_dict(content)
    # grid: 2 batch sizes x 2 prompt lengths x rank mixes (base, 4, 16; batches of 3 add two mixed ones)
    assert model.prefill.num_samples == model.decode.num_samples == 1 * 2 * 3 + 1 * 2 * 5
    assert model.prefill.rank_form in ("sum", "max") and model.prefill.other_r2 is not None
    assert model.decode.intercept_ms + model.decode.per_unit_ms > 0
    assert model.load is not None
    assert model.meta["device"] == "cpu" and model.meta["base_model"]
    assert {len(content["samples"][k]) for k in ("prefill", "decode")} == {16}
    assert "prefill:" in result.output and "decode:" in result.output and str(output) in result.output

    from gpu_workers.worker.builder import load_perf_profile
    from settings import Settings

    published = load_perf_profile(Settings(data_dir=tmp_path, worker_profile_path=output))
    assert published is not None and "samples" not in published  # heartbeats carry the fit only
    assert PerfModel.from_dict(published) == model


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--ranks", "8,999"), "ranks must be between 1 and max_rank"),
        (("--ranks", "eight"), "comma-separated integers"),
        (("--batch-sizes", "0"), "batch sizes must be between 1"),
        (("--batch-sizes", "64", "--prompt-tokens", "4096"), "must fit one prefill step"),
    ],
)
def test_bad_grids_are_refused_with_what_to_change(
    base_model_dir: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = _invoke(
        tmp_path, "--base-model", str(base_model_dir), "--output", str(tmp_path / "p.json"), *args
    )
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "p.json").exists()


def test_profile_needs_a_base_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LORAHOST_BASE_MODEL_PATH", raising=False)
    result = _invoke(tmp_path, "--output", str(tmp_path / "p.json"))
    assert result.exit_code == 2 and "--base-model" in result.output


def test_profile_also_writes_a_twin_profile_the_cost_model_loads(
    base_model_dir: Path, tmp_path: Path
) -> None:
    from twin.cost_model import CostModel
    from twin.profile import load_profile
    from twin.step_shape import StepShape

    output, twin = tmp_path / "profile.json", tmp_path / "twin" / "cpu.yaml"
    result = _invoke(
        tmp_path,
        *("--base-model", str(base_model_dir), "--output", str(output), "--twin-output", str(twin)),
        *("--ranks", "4,16", "--batch-sizes", "1,3", "--prompt-tokens", "8,24"),
        *("--decode-steps", "2", "--repeats", "1", "--work-dir", str(tmp_path / "adapters")),
    )
    assert result.exit_code == 0, result.output
    assert (
        PerfModel.from_dict(json.loads(output.read_text())).prefill.num_samples == 16
    )  # the router's file as before
    profile = load_profile(twin)
    assert profile.missing_sources() == []
    assert profile.hardware.device == "cpu" and profile.model.dtype_bytes == 4
    assert profile.model.num_layers > 0 and profile.memory.device_bytes > 0
    assert (
        profile.kv_bytes_per_token == profile.model.kv_bytes_per_token
    )  # the engine's pool agrees with the shape
    assert profile.copy_link.host_to_device_gbps > 0 and profile.step.scheduler_us > 0
    # preparations timed beside a decoding batch (gpu_workers/engine/prepare_timer.py)
    assert profile.copy_link.prepare_gbps is not None and profile.copy_link.prepare_step_factor >= 1.0
    assert "beside a decoding batch" in result.output
    assert "R^2" in profile.sources["step"] and "twin:" in result.output and str(twin) in result.output
    model = CostModel(profile)
    small = StepShape(num_decode_seqs=1, decode_context_tokens=9)
    large = StepShape(num_prefill_tokens=72, num_prefill_seqs=3, prefill_attention_tokens=3 * 24 * 12.0)
    assert (
        model.step_seconds(small) > 0 and model.step_seconds(large) > 0
    )  # noisy timings: no order between them


def test_the_router_and_the_twin_fit_one_measuring_pass(
    base_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_workers.engine import profiler

    passes: list[bool] = []
    time_grid = profiler.time_grid

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes.append(kwargs["twin_batches"])
        return time_grid(*args, **kwargs)

    monkeypatch.setattr(profiler, "time_grid", counted)
    output, twin = tmp_path / "profile.json", tmp_path / "twin.json"
    result = _invoke(
        tmp_path,
        *("--base-model", str(base_model_dir), "--output", str(output), "--twin-output", str(twin)),
        *("--ranks", "4,16", "--batch-sizes", "1,3", "--prompt-tokens", "8", "--decode-steps", "1"),
        *("--repeats", "1", "--work-dir", str(tmp_path / "adapters")),
    )
    assert result.exit_code == 0, result.output
    assert passes == [True]  # one pass, with the twin's batches, for both fits
    assert PerfModel.from_dict(json.loads(output.read_text())).prefill.num_samples == 3 + 5
    assert twin.exists()
