"""Where state lives (`storage`), how jobs run and when periodic ones do (`jobs`), and the usage ledger's
checkpoints and leases (`metering`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from settings.section import section_config


class StorageSettings(BaseModel):
    """The database, the blob store, Redis, and the ages after which the upload sweep cleans up."""

    model_config = section_config("")

    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite in data_dir")
    database_pool_size: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="PostgreSQL connections a process keeps open for reuse (more are opened under a burst, up to "
        "40 beyond it, and closed when returned); the API's usage writer holds up to three (opens, finals, "
        "checkpoints, each batched; on PostgreSQL the opener's and the finisher's are held open in autocommit "
        "mode), the rest serve requests' own reads and writes",
    )
    blob_store: str | None = Field(
        default=None, description="Local directory path or s3://bucket/prefix; default data_dir/blobs"
    )
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    redis_url: str | None = Field(default=None, description="Redis URL; None = embedded in-memory backends")
    redis_max_connections: int = Field(
        default=32,
        ge=1,
        le=10_000,
        description="Rate-limit checks of the request path (charge, slot, release) an API process's event loop has "
        "in flight to Redis at once, on its one pipelined connection (the name predates the pipelining): a check "
        "beyond waits for a turn (up to 5 s, then counts in the process and is logged as a wait, not as an outage)",
    )
    stale_version_age_s: float = Field(
        default=3600.0,
        gt=0,
        description="Upload sweep: an adapter version still uploading/validating this long after it was created "
        "lost its validation job (the process died); it is marked failed and its blobs deleted",
    )
    orphan_blob_min_age_s: float = Field(
        default=3600.0,
        gt=0,
        description="Upload sweep: staging blobs (uploads/) of no in-flight version and final blobs (adapters/) no "
        "version references are deleted once older than this; keep it above the longest upload's staging or "
        "validation time (a younger blob may be being written before its row commits)",
    )


class JobsSettings(BaseModel):
    """How jobs run (inline or Celery) and how often the periodic ones do.

    Every `*_interval_s` here means the same in both runners: seconds between runs, and 0 = disabled (no
    inline timer in the API with inline jobs, no Celery beat entry otherwise).
    """

    model_config = section_config("")

    is_inline_jobs: bool = Field(default=True, description="Run jobs inline (embedded) instead of via Celery")
    celery_broker_url: str | None = Field(default=None, description="Defaults to redis_url")
    celery_key_prefix: str = Field(default="", description="Prefix for every Celery key in Redis (isolation)")
    celery_queue: str = Field(default="lorahost", description="Celery queue the API sends jobs to")
    celery_visibility_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds after which a task a job runner took but never acknowledged (it was killed mid-job) "
        "is delivered again to a live one (Redis broker); a job running longer than this may run twice, which every "
        "lorahost job tolerates. Keep LORAHOST_STALE_VERSION_AGE_S above it, so a validation gets its second run "
        "before the sweep fails its version",
    )
    usage_sweep_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="Seconds between sweeps that close open usage rows as `interrupted` when their worker left the "
        "worker directory or their lease expired (Celery beat, or an inline timer in the API with inline jobs; "
        "0 = disabled)",
    )
    upload_sweep_interval_s: float = Field(
        default=600.0,
        ge=0,
        description="Seconds between upload sweeps (stale versions, then orphaned blobs): Celery beat in cluster "
        "mode, an inline timer with inline jobs; `lorahost serve` also sweeps once at start (0 = disabled)",
    )
    predictor_training_interval_s: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds between trainings of the length predictor on recent usage (Celery beat, or an inline "
        "timer in the API with inline jobs; 0 = disabled)",
    )
    placement_interval_s: float = Field(
        default=30.0,
        ge=0,
        description="Seconds between placement runs (Celery beat `lorahost.compute_placement`, or an inline timer "
        "in the API with inline jobs; 0 = disabled)",
    )


class MeteringSettings(BaseModel):
    """The usage ledger: how often streams checkpoint into their rows, and when an unrenewed row is closed."""

    model_config = section_config("usage_")

    checkpoint_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="API: seconds between checkpoints of a stream's delivered tokens into its usage row (at most one "
        "UPDATE per stream per interval, all streams in one transaction); a crash loses at most this much billing. "
        "The lease of all the process's open rows is renewed every quarter of usage_lease_timeout_s (one UPDATE for "
        "all; at least this interval apart), and so are their max_concurrent_requests slots (one Redis call)",
    )
    lease_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds after its last lease renewal (or checkpoint, or start) at which the usage sweep closes an "
        "open usage row as `interrupted`: its API process died and came back under another api_instance_id, or "
        "never came back (scale-down). Must exceed twice usage_checkpoint_interval_s; a live API that renews late "
        "still gives the row its final values. Also the lease of a max_concurrent_requests slot: one its API process "
        "has not renewed for this long stops counting (api/ratelimit.py)",
    )

    rollup_settle_s: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds after a UTC day ends before the usage sweep sums its usage rows into the daily rollup "
        "(usage_days), once none of them is open; billing and /v1/usage read a rolled day's sums instead of its "
        "rows. A later change to a rolled day's rows (a final update of an interrupted row) un-rolls that day "
        "until the next sweep",
    )

    @property
    def renewal_interval_s(self) -> float:
        """Seconds between renewals of an API process's open rows' leases and slots: a quarter of the lease, so
        three renewals in a row may fail or run late before a live request's row or slot expires; never more
        often than the checkpoints."""
        return max(self.checkpoint_interval_s, self.lease_timeout_s / 4)

    @model_validator(mode="after")
    def _check_lease(self) -> MeteringSettings:
        if self.lease_timeout_s <= 2 * self.checkpoint_interval_s:
            raise ValueError(
                f"usage_lease_timeout_s ({self.lease_timeout_s}) must be more than twice "
                f"usage_checkpoint_interval_s ({self.checkpoint_interval_s}), or the usage sweep closes the rows "
                "of live API processes between two lease renewals: raise LORAHOST_USAGE_LEASE_TIMEOUT_S or lower "
                "LORAHOST_USAGE_CHECKPOINT_INTERVAL_S"
            )
        return self
