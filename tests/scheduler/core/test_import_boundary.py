"""The engine core imports without torch (the digital twin runs it on a machine without one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_importing_the_core_in_a_fresh_interpreter_loads_no_torch_or_numpy() -> None:
    code = (
        "import sys\n"
        "import scheduler.core.batch_scheduler, scheduler.core.adapter_residency, scheduler.core.page_pool\n"
        "import scheduler.core.sequence, scheduler.core.sampling, scheduler.core.step_plan\n"
        "import scheduler.core.engine_core, scheduler.core.executor, scheduler.core.memory_geometry\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'safetensors', 'sqlalchemy', 'fastapi') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT, check=True
    )
    assert result.stdout.strip() == ""
