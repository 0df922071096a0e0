"""The worker process section (gpu_workers.worker.server, built by gpu_workers.worker.builder; `lorahost worker`, or in-process
under `lorahost serve`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from settings.section import section_config

DEFAULT_WORKER_PORT = 8100


class WorkerSettings(BaseModel):
    """The worker's backend, address, identity, membership heartbeats, profile and host adapter cache."""

    model_config = section_config("worker_")

    backend: str = Field(
        default="native",
        description="Worker inference backend (a name in gpu_workers.worker.builder.BACKENDS)",
    )
    host: str = Field(default="127.0.0.1", description="Worker bind address")
    port: int | None = Field(
        default=None,
        description="Worker port; 0 = a free port; unset = 8100 for `lorahost worker`, a free port for the "
        "in-process worker of `lorahost serve`",
    )
    advertise_url: str | None = Field(
        default=None,
        description="URL API servers reach this worker at; default http://worker_host:worker_port",
    )
    id: str | None = Field(default=None, description="Stable worker id; default <hostname>-<port>")
    key_prefix: str = Field(default="lorahost:workers:", description="Redis key prefix of worker membership")
    heartbeat_interval_s: float = Field(
        default=2.0,
        gt=0,
        validation_alias="heartbeat_interval_s",
        description="Seconds between worker heartbeats",
    )
    heartbeat_ttl_s: float | None = Field(
        default=None,
        validation_alias="heartbeat_ttl_s",
        description="Membership TTL; default 3x the interval",
    )
    drain_timeout_s: float = Field(
        default=30.0,
        ge=0,
        validation_alias="drain_timeout_s",
        description="Max wait for running requests on shutdown",
    )
    stream_keepalive_s: float = Field(
        default=5.0,
        ge=0,
        validation_alias="stream_keepalive_s",
        description="Worker: a generate stream that sent nothing for this long gets a blank keepalive line, so the "
        "API's read timeout (LORAHOST_WORKER_READ_TIMEOUT_S, keep it several times above this) only ends streams "
        "whose link went silent, not requests waiting their turn (0 = none)",
    )
    profile_path: Path | None = Field(
        default=None,
        description="Worker: the performance profile `lorahost profile` wrote for this worker's hardware and base "
        "model; its coefficients are published in heartbeats for the rank_aware router (unset: the router's "
        "default model)",
    )
    host_cache_dir: Path | None = Field(
        default=None,
        validation_alias="host_cache_dir",
        description="Worker adapter file cache; default data_dir/host_cache",
    )
    host_cache_max_bytes: int = Field(
        default=8 << 30,
        gt=0,
        validation_alias="host_cache_max_bytes",
        description="Host adapter cache budget",
    )

    def resolved_port(self, default: int = DEFAULT_WORKER_PORT) -> int:
        """The worker port: port when set, else `default` (0 = pick a free port)."""
        return self.port if self.port is not None else default

    def resolved_heartbeat_ttl_s(self) -> float:
        """How long a worker's membership lives without a heartbeat (default 3x the interval)."""
        return self.heartbeat_ttl_s if self.heartbeat_ttl_s is not None else 3 * self.heartbeat_interval_s

    embedded_memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="`lorahost serve`: the most bytes its in-process workers (one per base model served, the "
        "configured one included) hold at once, each counted whole: weights, KV and adapter pools, host adapter "
        "tier and an activation estimate (scheduler/scaling/worker_footprint.py); a catalog model starts with what is "
        "left (smaller pools, down to one request's worth), idle catalog models are stopped to make room, a "
        "model that can never fit is refused with a 503; unset: embedded_memory_fraction of the machine's memory",
    )
    embedded_memory_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="`lorahost serve`, when embedded_memory_bytes is unset: the budget is this share of the memory "
        "available to the process (the cgroup's memory.max / memory.limit_in_bytes when set, else MemTotal)",
    )
    embedded_idle_s: float = Field(
        default=300.0,
        gt=0,
        description="`lorahost serve`: a catalog model's in-process worker stops after this long with nothing to do "
        "(the configured base model's stays)",
    )
