"""The command line and environment of each process `lorahost dev-cluster` starts (lorahost/dev_cluster.py):
API replicas and workers through `lorahost.cli` (each worker with its engine and that engine's Python), the jobs process as a Celery worker with embedded beat."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lorahost import dev_services

if TYPE_CHECKING:
    from lorahost.dev_cluster_config import DevClusterConfig

REPO_ROOT = Path(__file__).resolve().parents[1]


def api_command(host: str, port: int) -> list[str]:
    """`lorahost api` on host:port."""
    return [sys.executable, "-m", "lorahost.cli", "api", "--host", host, "--port", str(port)]


def worker_command(
    host: str, port: int, advertise_url: str, worker_id: str, python: str = sys.executable
) -> list[str]:
    """`lorahost worker` on host:port, registered as worker_id at advertise_url, run by `python`."""
    return [
        python, "-m", "lorahost.cli", "worker", "--host", host, "--port", str(port),
        "--advertise-url", advertise_url, "--worker-id", worker_id,
    ]  # fmt: skip


def worker_engine(config: DevClusterConfig, index: int, env: Mapping[str, str]) -> str:
    """The engine of the cluster's worker number `index`: config.worker_engines in turn, else the environment's
    LORAHOST_ENGINE_BACKEND, else native."""
    engines = config.worker_engines
    return engines[index % len(engines)] if engines else env.get("LORAHOST_ENGINE_BACKEND", "native")


def worker_python(config: DevClusterConfig, engine: str) -> str:
    """The Python that runs a worker with `engine`: config.vllm_python for vLLM when set, else this one."""
    if engine == "vllm" and config.vllm_python is not None:
        return str(config.vllm_python)
    return sys.executable


def jobs_command(celery_queue: str, beat_schedule: Path) -> list[str]:
    """A solo-pool Celery worker with embedded beat on `celery_queue` (no gossip, mingle or heartbeat)."""
    return [
        sys.executable, "-m", "celery", "-A", "jobs.worker", "worker", "--beat", "--pool=solo",
        "--loglevel=INFO", "-Q", celery_queue, "--without-gossip", "--without-mingle",
        "--without-heartbeat", "-s", str(beat_schedule),
    ]  # fmt: skip


# glibc malloc arenas per process: its default (8 per core) let the API replicas' RSS creep up by ~6% over a
# soak's last 20 minutes as threads' arenas fragment; 2 bounds it (benchmarks/RESULTS.md, fifth pass)
MALLOC_ARENA_MAX = "2"


def child_env(extra: Mapping[str, str], owned: Mapping[str, str], *, is_moto: bool) -> dict[str, str]:
    """The environment of every child: this process's, then `extra` (the config's), then the moto
    credentials when the cluster runs moto, then what the cluster `owned` (it wins); the repository root
    leads PYTHONPATH; MALLOC_ARENA_MAX is MALLOC_ARENA_MAX unless one of the first two sets it."""
    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **extra}
    # glibc's malloc arenas, as the image sets them (Dockerfile): unless the environment says otherwise
    env.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENA_MAX)
    if is_moto:
        env.update(dev_services.MOTO_CREDENTIALS)
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env.update({"PYTHONPATH": python_path, **owned})
    return env
