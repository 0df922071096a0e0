"""The dtype the benchmarks run in: LORAHOST_BENCH_DTYPE when set, else the engine's own auto dtype on this
machine (gpu_workers/engine/config.py EngineConfig.resolved_dtype: bfloat16 on CUDA or on a CPU with fast bf16,
else float32), so a first run on a CPU without native bf16 is not an emulated, ~20x slower bf16 run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

ENV_NAME = "LORAHOST_BENCH_DTYPE"
DTYPE_HELP = (
    f"bfloat16, float16 or float32 (default: ${ENV_NAME}, else the engine's auto dtype on this machine)"
)


def engine_auto_dtype() -> str:
    """The dtype the engine's `dtype="auto"` resolves to on this machine, e.g. "bfloat16" or "float32"."""
    from gpu_workers.engine.config import EngineConfig

    return dtype_name(EngineConfig(model_path=Path("."), dtype="auto").resolved_dtype())


def bench_dtype(environ: Mapping[str, str] = os.environ) -> str:
    """$LORAHOST_BENCH_DTYPE when set (the override), else engine_auto_dtype()."""
    return environ.get(ENV_NAME) or engine_auto_dtype()


def dtype_name(dtype: object) -> str:
    """ "bfloat16" for torch.bfloat16 (or for the string "bfloat16")."""
    return str(dtype).removeprefix("torch.")


def add_dtype_arg(parser: argparse.ArgumentParser) -> None:
    """`--dtype`, defaulting to bench_dtype() (resolved now, so the run's JSON names the dtype it ran in)."""
    parser.add_argument("--dtype", default=bench_dtype(), help=DTYPE_HELP)
