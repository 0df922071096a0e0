"""Platform settings by concern, built once per entry point and passed down.

`Settings` composes one section per concern (api, limits, routing, storage, jobs, metering, placement,
scaling, predictor, worker, engine) beside the few values every process shares. Every value comes from an
explicit constructor argument or a `LORAHOST_*` environment variable whose name is the setting's flat name
(settings/env.py): `settings.engine.num_threads` is LORAHOST_ENGINE_NUM_THREADS, and the constructor takes
the flat name too (`Settings(engine_num_threads=2)`). Nothing here connects to anything or imports numpy;
building a `Settings` is pure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from settings.api import ApiSettings, LimitsSettings, RoutingSettings
from settings.capacity import PlacementSettings, PredictorSettings, ScalingSettings
from settings.engine import EngineSettings
from settings.env import env_text, flat_env_sources, flat_values, nest_flat
from settings.section import env_name, flat_names
from settings.storage import JobsSettings, MeteringSettings, StorageSettings
from settings.worker import WorkerSettings

__all__ = ["Settings"]


class Settings(BaseSettings):
    """All platform configuration. Construct once in an entry point (CLI, app factory, worker)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    data_dir: Path = Field(
        default=Path(".lorahost"), description="Embedded-mode state: DB, blobs, demo model"
    )
    base_model_path: Path | None = None
    base_model_name: str = "lorahost-base"
    internal_token: str | None = Field(
        default=None, description="Shared secret for the worker's internal API"
    )

    api: ApiSettings = Field(default_factory=ApiSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    jobs: JobsSettings = Field(default_factory=JobsSettings)
    metering: MeteringSettings = Field(default_factory=MeteringSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    scaling: ScalingSettings = Field(default_factory=ScalingSettings)
    predictor: PredictorSettings = Field(default_factory=PredictorSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)

    def __init__(self, **values: Any) -> None:
        super().__init__(**nest_flat(type(self), values))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Constructor keywords, then the flat LORAHOST_* environment names."""
        return flat_env_sources(settings_cls, init_settings)

    def updated(self, **flat: Any) -> Settings:
        """A copy with the given settings (flat names, e.g. worker_advertise_url=...) replaced, unvalidated
        like model_copy; the environment is not read again."""
        update: dict[str, Any] = {}
        for key, value in nest_flat(type(self), flat).items():
            if isinstance(value, dict):
                section = getattr(self, key)
                names = flat_names(type(section))
                value = section.model_copy(update={names[name]: item for name, item in value.items()})
            update[key] = value
        return self.model_copy(update=update)

    def env_vars(self) -> dict[str, str]:
        """LORAHOST_* environment variables that rebuild these settings in a child process (unset ones left out)."""
        return {
            env_name(flat): env_text(value) for flat, value in flat_values(self).items() if value is not None
        }

    def resolved_database_url(self) -> str:
        """The database URL, defaulting to a SQLite file inside data_dir."""
        if self.storage.database_url:
            return self.storage.database_url
        return f"sqlite:///{(self.data_dir / 'lorahost.db').resolve()}"

    def resolved_blob_store(self) -> str:
        """The blob store location, defaulting to data_dir/blobs."""
        if self.storage.blob_store:
            return self.storage.blob_store
        return str((self.data_dir / "blobs").resolve())

    def resolved_broker_url(self) -> str | None:
        """The Celery broker URL (falls back to the Redis URL)."""
        return self.jobs.celery_broker_url or self.storage.redis_url

    def resolved_worker_view_cache_s(self) -> float:
        """How long the API reuses a worker listing: worker_view_cache_s, at most a quarter of the heartbeat TTL."""
        return min(self.routing.worker_view_cache_s, self.worker.resolved_heartbeat_ttl_s() / 4)

    def resolved_upload_tmp_dir(self) -> Path:
        """The root of the API's upload scratch folders (default data_dir/upload-tmp)."""
        return self.api.upload_tmp_dir or (self.data_dir / "upload-tmp")

    def resolved_max_lora_rank(self) -> int:
        """The largest adapter rank a worker's engine serves: engine_max_lora_rank, else the upload limit. The one
        place it is resolved: the engine, the vLLM backend, the twin and the capacity planner all read it here."""
        return self.engine.max_lora_rank or self.limits.max_rank

    def resolved_host_cache_dir(self) -> Path:
        """The worker's adapter file cache directory (default data_dir/host_cache)."""
        return self.worker.host_cache_dir or (self.data_dir / "host_cache")
