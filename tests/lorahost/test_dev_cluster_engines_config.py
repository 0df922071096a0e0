"""Which engine and Python each dev-cluster worker gets (`worker_engines`, `vllm_python`), and the CLI's
message for an unknown engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lorahost.cli import app
from lorahost.dev_cluster_commands import worker_engine, worker_python
from lorahost.dev_cluster_config import DevClusterConfig


def test_workers_take_the_configured_engines_in_turn(tmp_path: Path) -> None:
    config = DevClusterConfig(data_dir=tmp_path, worker_engines=("vllm", "native"))
    assert [worker_engine(config, i, {}) for i in range(4)] == ["vllm", "native", "vllm", "native"]


def test_without_engines_a_worker_takes_the_environments_or_native(tmp_path: Path) -> None:
    config = DevClusterConfig(data_dir=tmp_path)
    assert worker_engine(config, 0, {}) == "native"
    assert worker_engine(config, 3, {"LORAHOST_ENGINE_BACKEND": "vllm"}) == "vllm"


def test_vllm_workers_run_with_the_vllm_python_and_native_ones_with_this_one(tmp_path: Path) -> None:
    config = DevClusterConfig(data_dir=tmp_path, vllm_python=Path("/opt/vllm/bin/python"))
    assert worker_python(config, "vllm") == "/opt/vllm/bin/python"
    assert worker_python(config, "native") == sys.executable
    assert worker_python(DevClusterConfig(data_dir=tmp_path), "vllm") == sys.executable


def test_an_unknown_engine_is_refused_with_the_choices(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"unknown worker engine\(s\) \['tgi'\]; choose from \['native', 'vllm'\]"
    ):
        DevClusterConfig(data_dir=tmp_path, worker_engines=("native", "tgi"))
    result = CliRunner().invoke(app, ["dev-cluster", "--data-dir", str(tmp_path), "--engines", "native,tgi"])
    assert result.exit_code == 2 and "unknown worker engine" in result.output
