"""The backing services of one `lorahost dev-cluster` run: a fresh PostgreSQL database (migrated; dropped on stop
unless kept or given), S3 (a moto server unless an endpoint is given; the bucket created), this run's Redis keys
(deleted on stop) and the base model directory (the tiny demo model unless one is given)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from lorahost import dev_services
from lorahost.dev_cluster_commands import worker_engine
from lorahost.dev_cluster_config import DevClusterConfig
from lorahost.processes import ChildProcess

log = logging.getLogger("lorahost.dev_cluster")


class DevServices:
    """Start and stop what the cluster's processes run against."""

    def __init__(self, config: DevClusterConfig, data_dir: Path) -> None:
        self.config = config
        self.data_dir = data_dir
        self.database_url: str | None = config.database_url
        self.s3_endpoint: str | None = config.s3_endpoint
        self.base_model: Path | None = Path(config.base_model).resolve() if config.base_model else None
        self.s3: ChildProcess | None = None  # the moto server started here, if any
        self._is_database_created = False

    def start(self, log_path: Callable[[str], Path], child_env: Callable[[], dict[str, str]]) -> None:
        """Check Redis, make the base model, create and migrate the database, start moto, create the bucket, add
        config.catalog_models to the catalog (with the settings the children get from `child_env()`)."""
        from migrations.runner import upgrade

        config = self.config
        self.data_dir.mkdir(parents=True, exist_ok=True)
        dev_services.check_redis(config.redis_url)
        if self.base_model is None:
            from lorahost.default_model import tiny_demo_model

            engines = {*config.worker_engines, worker_engine(config, 0, {**os.environ, **config.env})}
            size = "tiny64" if "vllm" in engines else "tiny"  # vLLM's CPU attention refuses head dim 16
            self.base_model = tiny_demo_model(self.data_dir, echo=log.info, size=size)
        if self.database_url is None:
            self.database_url = dev_services.create_database(config.postgres_admin_url)
            self._is_database_created = True
        upgrade(self.database_url)
        if self.s3_endpoint is None:
            for name, value in dev_services.MOTO_CREDENTIALS.items():
                os.environ.setdefault(name, value)  # this process talks to moto too (bucket, tests)
            self.s3 = dev_services.start_moto(config.host, log_path("s3"), config.start_timeout_s)
            self.s3_endpoint = self.s3.url
        dev_services.ensure_bucket(self.s3_endpoint or "", config.bucket)
        if config.catalog_models:
            add_catalog_models(config.catalog_models, child_env())

    def stop(self, redis_patterns: list[str]) -> None:
        """Stop moto, delete this run's Redis keys (`redis_patterns`), drop the database this run created."""
        if self.s3 is not None:
            self.s3.stop(5)
            self.s3 = None
            self.s3_endpoint = self.config.s3_endpoint
        dev_services.delete_redis_keys(self.config.redis_url, redis_patterns)
        if self._is_database_created and not self.config.is_database_kept and self.database_url:
            dev_services.drop_database(self.config.postgres_admin_url, self.database_url)
            self._is_database_created = False


def add_catalog_models(models: Mapping[str, Path], env: Mapping[str, str]) -> None:
    """`lorahost models add NAME --from DIR` for each model, against the database and blob store in `env` (a
    child's environment: the cluster's LORAHOST_* settings and S3 credentials)."""
    for name, path in models.items():
        dev_services.run_cli(["models", "add", name, "--from", str(path)], env)
