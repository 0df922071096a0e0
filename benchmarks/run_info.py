"""What a benchmark result was measured on: the commit of the tree (and whether the engine sources differ from
it), the CPU model and the CPU flags that decide which kernels are fast.
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


# Flags that change which CPU kernels are fastest (vector width, bf16 dot products, matrix units).
NOTABLE_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "asimd",
    "sve",
)


def cpu_flags() -> list[str]:
    """The notable CPU flags this machine has (NOTABLE_FLAGS order)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")) and ":" in line:
                present = set(line.split(":", 1)[1].split())
                return [flag for flag in NOTABLE_FLAGS if flag in present]
    except OSError:
        pass
    return []


def device_name(device: object) -> str:
    """The card's name (torch.cuda.get_device_name) for a CUDA device, else "CPU <model>"."""
    import torch

    dev = torch.device(device)  # type: ignore[call-overload]
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU {cpu_model()}"
