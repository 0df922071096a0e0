"""The README's first command: `lorahost demo` runs the whole platform end to end on embedded defaults."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts the demo in a subprocess (lorahost serve and its worker)


def test_demo_runs_platform_end_to_end_and_bills_what_it_served(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "lorahost.cli",
            "demo",
            "--model",
            "tiny",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "uploaded demo-a: version 1 status=ready" in out
    assert "uploaded demo-b: version 1 status=ready" in out
    assert "demo-b completion:" in out and "streaming chat:" in out
    assert "base model vs adapters" in out and "What is the capital of Italy?" in out
    usage_rows = [line for line in out.splitlines() if "│ demo-" in line and "ok=" in line]
    assert len(usage_rows) == 2, out  # one usage row per adapter, all ok
    assert "models add" in out and "tiny-second" in out  # a second base model added while serving
    assert "uploaded second-a: version 1 status=ready" in out
    bill_lines = [line.split("│") for line in out.splitlines() if line.startswith("│ acme-")]
    assert {cells[2].strip() for cells in bill_lines} == {"lorahost-base", "tiny-second"}, (
        out
    )  # a line per base
    assert "/console (sign in with the tenant or the admin key): 3 ready adapter versions" in out
    assert "demo finished" in out
    assert (tmp_path / "data" / "lorahost.db").exists()
