"""What a benchmark result was measured on: the commit of the tree (and whether the engine sources differ from
it) and the CPU model.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git_state() -> dict:
    """Commit of the tree being measured, and whether the engine sources differ from it."""

    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=str(REPO), capture_output=True, text=True, check=False)
        return r.stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "gpu_workers_dirty": bool(git("status", "--porcelain", "--", "gpu_workers")),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
