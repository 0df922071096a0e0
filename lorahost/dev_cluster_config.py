"""`DevClusterConfig`: what `lorahost dev-cluster` (lorahost/dev_cluster.py) starts and against which
services; frozen, checked on construction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lorahost import dev_services
from settings.engine import ENGINE_BACKENDS


@dataclass(frozen=True)
class DevClusterConfig:
    """What `DevCluster` starts. Ports None = free ports; base_model None = the tiny demo model (generated)."""

    data_dir: Path
    base_model: Path | None = None
    base_model_name: str = "lorahost-base"
    num_api: int = 2
    num_workers: int = 3
    host: str = "127.0.0.1"
    api_base_port: int | None = None
    worker_base_port: int | None = None
    database_url: str | None = None  # None: a fresh database through postgres_admin_url, dropped on stop
    postgres_admin_url: str = dev_services.DEFAULT_POSTGRES_ADMIN_URL
    is_database_kept: bool = False
    redis_url: str = dev_services.DEFAULT_REDIS_URL
    s3_endpoint: str | None = None  # None: start a moto server
    bucket: str = "lorahost-dev"
    admin_key: str | None = None  # None: generated
    is_jobs_enabled: bool = True
    is_autoscale: bool = False
    max_workers: int = 8
    scaler_interval_s: float = 2.0
    start_timeout_s: float = 180.0
    stop_timeout_s: float = 30.0
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for every child
    jobs_env: Mapping[str, str] = field(default_factory=dict)  # and for the jobs process only (after env)
    # the engine of each worker started, in turn (worker n: worker_engines[n % len]); () = the environment's
    # LORAHOST_ENGINE_BACKEND (native by default)
    worker_engines: tuple[str, ...] = ()
    vllm_python: Path | None = (
        None  # the Python that runs vLLM workers (None: this one, which must have vllm)
    )
    # more base models, added to the catalog at start (name -> model directory); their workers fetch them by name
    catalog_models: Mapping[str, Path] = field(default_factory=dict)
    num_catalog_workers: int = 1  # workers started per catalog model (0: none until start_worker asks)

    def __post_init__(self) -> None:
        if self.num_api < 1:
            raise ValueError("num_api must be >= 1 (the cluster is reached through its API replicas)")
        if self.num_workers < 0 or self.max_workers < 0 or self.num_catalog_workers < 0:
            raise ValueError("num_workers, num_catalog_workers and max_workers must be >= 0")
        if self.base_model_name in self.catalog_models:
            raise ValueError(
                f"catalog_models must not name the configured base model {self.base_model_name!r}"
            )
        unknown = sorted(set(self.worker_engines) - set(ENGINE_BACKENDS))
        if unknown:
            raise ValueError(f"unknown worker engine(s) {unknown}; choose from {list(ENGINE_BACKENDS)}")
