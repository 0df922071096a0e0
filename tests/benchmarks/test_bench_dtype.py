"""The benchmarks' dtype: the engine's own auto dtype unless LORAHOST_BENCH_DTYPE overrides it. No speed asserted."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_dtype

from gpu_workers.engine import config as engine_config
from gpu_workers.engine.config import EngineConfig


def test_default_is_the_engines_auto_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(bench_dtype.ENV_NAME, raising=False)
    auto = EngineConfig(model_path=Path("."), dtype="auto").resolved_dtype()
    assert bench_dtype.bench_dtype() == str(auto).removeprefix("torch.")


@pytest.mark.parametrize(("is_fast_bf16", "expected"), [(False, "float32"), (True, "bfloat16")])
def test_default_follows_the_cpu(monkeypatch: pytest.MonkeyPatch, is_fast_bf16: bool, expected: str) -> None:
    """An AVX2-only CPU (no native bf16) runs float32, not emulated bf16."""
    monkeypatch.delenv(bench_dtype.ENV_NAME, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(engine_config, "_cpu_has_fast_bf16", lambda: is_fast_bf16)
    assert bench_dtype.bench_dtype() == expected
    parser = argparse.ArgumentParser()
    bench_dtype.add_dtype_arg(parser)
    assert parser.parse_args([]).dtype == expected


def test_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_config, "_cpu_has_fast_bf16", lambda: True)
    monkeypatch.setenv(bench_dtype.ENV_NAME, "float32")
    assert bench_dtype.bench_dtype() == "float32"
    parser = argparse.ArgumentParser()
    bench_dtype.add_dtype_arg(parser)
    assert parser.parse_args([]).dtype == "float32"
    assert parser.parse_args(["--dtype", "float16"]).dtype == "float16"
