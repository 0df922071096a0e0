"""Platform settings, built once per entry point and passed down.

Every value comes from an explicit constructor argument or a `LORAHOST_*` environment variable.
Nothing here connects to anything; building a `Settings` is pure.
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from scheduler.batch_policy import BATCH_POLICIES
from scheduler.eviction import DEFAULT_EVICTION_POLICY, EVICTION_POLICIES
from scheduler.multiqueue import DEFAULT_MAX_QUEUES, DEFAULT_REFRESH_S, DEFAULT_SLO_S
from scheduler.placement import default_operating_points
from scheduler.placement_baselines import PLACEMENT_POLICIES
from scheduler.router_policies import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES

DEFAULT_WORKER_PORT = 8100
LENGTH_PREDICTORS = ("learned", "max_tokens")  # api/inference/learned_predictor.py, api/inference/predict.py


class Settings(BaseSettings):
    """All platform configuration. Construct once in an entry point (CLI, app factory, worker)."""

    model_config = SettingsConfigDict(env_prefix="LORAHOST_", extra="ignore", frozen=True)

    data_dir: Path = Field(default=Path(".lorahost"), description="Embedded-mode state: DB, blobs, demo model")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite in data_dir")
    blob_store: str | None = Field(
        default=None, description="Local directory path or s3://bucket/prefix; default data_dir/blobs"
    )
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    redis_url: str | None = Field(default=None, description="Redis URL; None = embedded in-memory backends")
    celery_broker_url: str | None = Field(default=None, description="Defaults to redis_url")
    is_inline_jobs: bool = Field(default=True, description="Run jobs inline (embedded) instead of via Celery")
    celery_key_prefix: str = Field(default="", description="Prefix for every Celery key in Redis (isolation)")
    celery_queue: str = Field(default="lorahost", description="Celery queue the API sends jobs to")

    admin_key: str | None = None
    metrics_token: str | None = Field(
        default=None,
        description="API: bearer token that opens /metrics to a Prometheus scraper (besides the admin key). "
        "By default /metrics needs `Authorization: Bearer <admin key or metrics_token>`: it names workers",
    )
    is_metrics_public: bool = Field(
        default=False,
        description="API: serve /metrics without authentication (only behind a network that keeps it private)",
    )
    internal_token: str | None = Field(default=None, description="Shared secret for the worker's internal API")

    base_model_path: Path | None = None
    base_model_name: str = "lorahost-base"

    host: str = "127.0.0.1"
    port: int = 8000

    max_upload_bytes: int = 512 * 1024 * 1024
    max_uncompressed_bytes: int = 1024 * 1024 * 1024
    max_rank: int = 256
    max_adapter_bytes: int = 512 * 1024 * 1024
    max_archive_members: int = 8
    max_prompt_tokens: int = 4096
    max_prompt_chars_per_token: int = Field(
        default=32,
        gt=0,
        description="API: a prompt (or chat messages' text) longer than max_prompt_tokens x this many characters "
        "is refused (400) before it is tokenized; no common tokenizer averages more characters per token",
    )
    max_completion_tokens: int = 2048
    max_request_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        gt=0,
        description="API: largest inference request body (413 beyond it, checked while the body is read); keep "
        "it above the largest allowed prompt as JSON (max_prompt_tokens x max_prompt_chars_per_token x ~4)",
    )
    cold_start_timeout_s: float = Field(
        default=120.0,
        ge=0,
        description="API: how long an inference request waits for a ready worker of its base model (cold start, "
        "model still loading, scale from zero) before it is refused with 503 + Retry-After",
    )
    cold_start_poll_interval_s: float = Field(
        default=0.1, gt=0, description="API: how often a request waiting through a cold start re-reads the workers"
    )
    auth_cache_ttl_s: float = Field(
        default=5.0, ge=0, description="API: verified keys cached per process; the revocation delay across replicas"
    )
    model_cache_ttl_s: float = Field(
        default=2.0, ge=0, description="API: resolved adapter versions cached per process (0 = off)"
    )
    api_instance_id: str | None = Field(
        default=None,
        max_length=200,
        description="API: owner id of the usage rows this process opens; on start a process closes the rows its "
        "predecessor with the same id left open (crash, kill -9) as `interrupted`. Default <hostname>-<port> "
        "(`lorahost api`; give each replica a stable id, e.g. its StatefulSet pod name) or <hostname>-embedded "
        "(`lorahost serve`)",
    )
    usage_checkpoint_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="API: seconds between checkpoints of a stream's delivered tokens into its usage row (at most one "
        "UPDATE per stream per interval, all streams in one transaction); a crash loses at most this much billing. "
        "The lease of all the process's open rows is renewed at the same rate (one UPDATE per interval), and so are "
        "their max_concurrent_requests slots (one Redis call per interval)",
    )
    usage_lease_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds after its last lease renewal (or checkpoint, or start) at which the usage sweep closes an "
        "open usage row as `interrupted`: its API process died and came back under another api_instance_id, or "
        "never came back (scale-down). Must exceed twice usage_checkpoint_interval_s; a live API that renews late "
        "still gives the row its final values. Also the lease of a max_concurrent_requests slot: one its API process "
        "has not renewed for this long stops counting (api/ratelimit.py)",
    )
    usage_sweep_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="Seconds between sweeps that close open usage rows as `interrupted` when their worker left the "
        "worker directory or their lease expired (Celery beat, or an inline timer in the API with inline jobs; "
        "0 = no inline timer)",
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
    upload_sweep_interval_s: float = Field(
        default=600.0,
        ge=0,
        description="Seconds between upload sweeps (stale versions, then orphaned blobs): Celery beat in cluster "
        "mode, an inline timer with inline jobs; `lorahost serve` also sweeps once at start (0 = no inline timer)",
    )
    upload_tmp_dir: Path | None = Field(
        default=None,
        description="API: where multipart upload bodies are written before validation, one subfolder per API "
        "instance (api_instance_id), emptied when that instance starts; default data_dir/upload-tmp",
    )
    import_allowed_buckets: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="API: s3:// buckets a tenant may import adapters from WITHOUT its own credentials, read with "
        "the platform's credentials (comma-separated names; default none). The platform's own blob bucket is "
        "refused even when listed",
    )
    is_import_private_network_allowed: bool = Field(
        default=False,
        description="API: also let imports reach http:// URLs and loopback/private/link-local addresses (import "
        "URLs and tenant S3 endpoints). Tests and local development only: it opens the internal network to "
        "tenants",
    )

    router_policy: str = Field(
        default=DEFAULT_ROUTER_POLICY,
        description=f"API: how a request picks its worker, one of {sorted(ROUTER_POLICIES)} (scheduler/router.py)",
    )
    router_slo_tpot_ms: float | None = Field(
        default=None,
        gt=0,
        description="API, rank_aware router: the time-per-output-token SLO (ms) above which a worker's cost is "
        "penalised; default per worker: 1.5x its single-request decode step at the request's rank (CaraServe)",
    )
    router_cold_fetch_ms: float = Field(
        default=50.0,
        ge=0,
        description="API, rank_aware router: the estimated fetch (ms) of an adapter a worker holds nowhere, on top "
        "of its profiled host -> device load",
    )
    worker_view_cache_s: float = Field(
        default=0.5,
        ge=0,
        description="API: seconds the live worker listing (Redis) is reused before it is read again (0 = every "
        "request), capped at a quarter of the heartbeat TTL (a dead worker leaves routing soon after its record "
        "expires). While Redis fails, the last listing is used",
    )

    length_predictor: str = Field(
        default="learned",
        description=f"API: how a request's output length is predicted, one of {sorted(LENGTH_PREDICTORS)}: learned = "
        "the model trained on usage (hot-reloaded from the blob store; its prior until one is trained), "
        "max_tokens = every request uses all of its max_tokens",
    )
    predictor_reload_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="API: seconds between checks for a newer length predictor artifact in the blob store (the first "
        "at startup); 0 = never load one (the prior, fed with this process's finished requests)",
    )
    predictor_training_interval_s: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds between trainings of the length predictor on recent usage (Celery beat, or an inline "
        "timer in the API with inline jobs; 0 = no inline timer)",
    )
    predictor_min_training_samples: int = Field(
        default=200,
        ge=10,
        description="Training is skipped (and logged) with fewer finished requests than this in the training window",
    )
    predictor_max_training_samples: int = Field(
        default=20_000,
        gt=0,
        description="Training reads at most this many of the most recent finished requests (a fit of 20k takes a few "
        "CPU seconds)",
    )
    predictor_training_window_s: float = Field(
        default=7 * 86400.0, gt=0, description="Training reads finished requests that started this recently"
    )

    # Placement (LoRAServe, scheduler/placement.py) and autoscaling (scheduler/scaling.py): one capacity model.
    placement_interval_s: float = Field(
        default=30.0,
        ge=0,
        description="Seconds between placement runs (Celery beat `lorahost.compute_placement`, or an inline timer "
        "in the API with inline jobs; 0 = no inline timer)",
    )
    placement_bucket_s: float = Field(default=60.0, gt=0, description="Demand history bucket length (seconds)")
    placement_history_buckets: int = Field(
        default=10, ge=1, description="Buckets of usage history the demand forecast (max of EWMA, last bucket) reads"
    )
    placement_ewma_alpha: float = Field(default=0.5, gt=0, le=1, description="EWMA smoothing of the demand forecast")
    placement_policy: str = Field(
        default="loraserve",
        description="loraserve (rank-bucketed fractional placement), or the baselines random | contiguous "
        "(one holder per adapter, scheduler/placement_baselines.py)",
    )
    placement_min_phi: float = Field(
        default=0.05, ge=0, lt=0.5, description="Smallest routing weight of an adapter on a worker (smaller merge)"
    )
    worker_tokens_per_s: float = Field(
        default=1000.0,
        gt=0,
        description="Capacity model: tokens/s (prompt + completion) one worker sustains within the SLO without LoRA; "
        "OP[rank] = this / (1 + 0.016 rank) unless worker_operating_points is set",
    )
    worker_operating_points: dict[int, float] | None = Field(
        default=None,
        description='Capacity model from a profile: JSON {"<rank bucket>": tokens/s, ...} (its keys are the rank '
        "buckets); overrides worker_tokens_per_s",
    )
    placement_key_prefix: str = Field(default="lorahost:placement:", description="Redis key prefix of the routing table")
    routing_table_refresh_s: float = Field(
        default=5.0, gt=0, description="API: seconds between reads of the published routing table into memory"
    )
    scaling_target_utilisation: float = Field(
        default=0.8, gt=0, le=1, description="Autoscaling: workers are sized to run at this share of capacity"
    )
    scaling_min_workers: int = Field(default=0, ge=0, description="Autoscaling: fewest workers per base model")
    scaling_max_workers: int = Field(default=8, ge=0, description="Autoscaling: most workers per base model")
    scale_to_zero_idle_s: float = Field(
        default=600.0, ge=0, description="Autoscaling: a base model with no request for this long goes to 0 workers"
    )
    scale_down_cooldown_s: float = Field(
        default=300.0,
        ge=0,
        description="Autoscaling: workers are sized for the peak demand of this window (no scale-down on shorter dips)",
    )
    scaling_max_waiting_per_worker: int = Field(
        default=8, ge=1, description="Autoscaling: more waiting requests per live worker than this adds workers"
    )

    # Worker process (gpu_workers.server, built by gpu_workers.builder; `lorahost worker`, or in-process under
    # `lorahost serve`).
    worker_backend: str = Field(
        default="native", description="Worker inference backend (a name in gpu_workers.builder.BACKENDS)"
    )
    worker_host: str = Field(default="127.0.0.1", description="Worker bind address")
    worker_port: int | None = Field(
        default=None,
        description="Worker port; 0 = a free port; unset = 8100 for `lorahost worker`, a free port for the "
        "in-process worker of `lorahost serve`",
    )
    worker_advertise_url: str | None = Field(
        default=None, description="URL API servers reach this worker at; default http://worker_host:worker_port"
    )
    worker_id: str | None = Field(default=None, description="Stable worker id; default <hostname>-<port>")
    worker_key_prefix: str = Field(default="lorahost:workers:", description="Redis key prefix of worker membership")
    heartbeat_interval_s: float = Field(default=2.0, gt=0, description="Seconds between worker heartbeats")
    heartbeat_ttl_s: float | None = Field(default=None, description="Membership TTL; default 3x the interval")
    drain_timeout_s: float = Field(default=30.0, ge=0, description="Max wait for running requests on shutdown")
    worker_profile_path: Path | None = Field(
        default=None,
        description="Worker: the performance profile `lorahost profile` wrote for this worker's hardware and base "
        "model; its coefficients are published in heartbeats for the rank_aware router (unset: the router's "
        "default model)",
    )
    host_cache_dir: Path | None = Field(default=None, description="Worker adapter file cache; default data_dir/host_cache")
    host_cache_max_bytes: int = Field(default=8 << 30, gt=0, description="Host adapter cache budget")
    engine_dtype: str = Field(default="auto", description="bfloat16, float16, float32 or auto")
    engine_device: str = Field(default="auto", description="cpu, cuda or auto")
    engine_kv_cache_bytes: int = Field(
        default=1 << 30, gt=0, description="KV cache budget (bytes); in a unified pool KV and adapters share it"
    )
    engine_num_kv_blocks: int | None = Field(default=None, description="KV blocks; overrides the byte budget")
    engine_max_num_seqs: int = Field(default=64, gt=0, description="Max requests running in one batch")
    engine_max_num_batched_tokens: int = Field(default=4096, gt=0, description="Per-step token budget")
    engine_max_model_len: int | None = Field(default=None, description="Default: the model's context length")
    engine_num_threads: int | None = Field(default=None, description="torch CPU threads (default: torch's)")
    engine_adapter_cache_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Device bytes for adapters in the page pool, on top of the KV cache (the only limit on how "
        "many adapters are on the device; requests wait for room). unified: added to the shared pool (default "
        "0); static: the fixed adapter share (default: room for 64 adapters of max_rank)",
    )
    engine_memory_mode: Literal["unified", "static"] = Field(
        default="unified",
        description="Device memory layout: unified = KV blocks and adapter weights share every page of one "
        "budget (adapters stored in the KV cache's pages); static = fixed adapter share beside the KV cache "
        "(the vLLM-style baseline)",
    )
    engine_batch_policy: str = Field(
        default="fifo",
        description="Admission order of waiting requests, one of "
        f"{sorted(BATCH_POLICIES)} (scheduler/batch_policy.py: fifo = arrival order with head-of-line blocking; "
        "sjf = fewest predicted output tokens first; multiqueue = Chameleon's size-class queues with token "
        "quotas, scheduler/multiqueue.py)",
    )
    engine_fair_share: bool = Field(
        default=True,
        description="Fair share of each engine between tenants (scheduler/fair_share.py, the Virtual Token "
        "Counter of Sheng et al., OSDI'24): the least-served tenant's waiting request is admitted first, in "
        "the batch policy's order within a tenant; false admits in the batch policy's order alone. No effect "
        "while one tenant sends requests.",
    )
    engine_fair_share_reserved_seqs: int = Field(
        default=1,
        ge=0,
        description="With fair share: batch slots a tenant that already has a request running may not take, "
        "kept for a tenant with nothing running, so a newly arriving tenant is admitted at the next step "
        "instead of waiting for a flooding tenant's request to finish (costs at most this many of "
        "engine_max_num_seqs slots while one tenant alone fills the batch; requests without a tenant are "
        "never held back); 0 = off",
    )
    engine_multiqueue_slo_s: float = Field(
        default=DEFAULT_SLO_S,
        gt=0,
        description="multiqueue: the TTFT SLO (seconds) its M/M/1 rule sizes each queue's minimum token quota for",
    )
    engine_multiqueue_refresh_s: float = Field(
        default=DEFAULT_REFRESH_S,
        gt=0,
        description="multiqueue: seconds between recomputing its size classes (K-means) and quotas",
    )
    engine_multiqueue_max_queues: int = Field(
        default=DEFAULT_MAX_QUEUES,
        ge=1,
        le=16,
        description="multiqueue: the most size classes (Kmax); its K selection may choose fewer",
    )
    adapter_eviction_policy: str = Field(
        default=DEFAULT_EVICTION_POLICY,
        description="Worker: which idle device adapter is evicted first when a step needs pages, one of "
        f"{sorted(EVICTION_POLICIES)} (scheduler/eviction.py: least recently used; Chameleon's "
        "frequency/recency/size score; FastLibra's reload cost x reuse probability x recency decay)",
    )
    engine_adapter_cache: bool = Field(
        default=True,
        description="Keep adapters no request uses on the device while memory is free (the adapter cache); "
        "false evicts an adapter as soon as no running or waiting request uses it (the S-LoRA / no-cache "
        "baseline: every later request for it copies it again, and prefetch hints last one step)",
    )
    engine_enable_prefix_caching: bool = Field(
        default=True, description="Reuse the KV of prompt prefixes shared by requests of the same adapter version"
    )
    engine_host_adapter_cache_bytes: int = Field(
        default=2 << 30,
        ge=0,
        description="Host memory for packed adapter copies (the tier between the device and the disk cache; "
        "a copy to the device from it skips reading and validating files); 0: off",
    )
    engine_adapter_link_gbps: float | None = Field(
        default=None,
        gt=0,
        description="Emulated host->device adapter link bandwidth in GB/s (a copy of n bytes takes at least "
        "n / bandwidth seconds); default: no emulation",
    )
    engine_cpu_prefill_workers: int = Field(
        default=2,
        ge=0,
        description="CPU threads computing the LoRA delta of prefills whose adapter is still being copied "
        "(CPU-assisted prefill); 0: such requests wait for the copy",
    )
    engine_fp32_prefill_gemms: bool | None = Field(
        default=None,
        description="bf16 model on CPU: prefill-sized products (>= 128 rows) in fp32 upcasts; default: chosen by "
        "measurement at worker start (cached per CPU, torch version, threads and shape); costs a dense copy of "
        "the weights",
    )
    engine_kernel_choices_path: Path | None = Field(
        default=None,
        description="JSON cache of the CPU kernels chosen by measurement (gpu_workers/kernel_tuner.py); "
        "default ~/.cache/lorahost/kernel_choices.json",
    )
    engine_prefill_gemm: Literal["packed", "fp32_upcast", "plain"] | None = Field(
        default=None,
        description="force the prefill GEMM form of a packed bf16 model (packed / fp32_upcast / plain); default: "
        "chosen by measurement at worker start (`lorahost tune`); wins over engine_fp32_prefill_gemms",
    )
    engine_decode_attention: Literal["sdpa", "sdpa_fp32", "grouped_matmul", "c_kernel"] | None = Field(
        default=None,
        description="force the decode attention form (sdpa / sdpa_fp32 / grouped_matmul / c_kernel); default: chosen "
        "by measurement at worker start",
    )
    engine_decode_lora_form: Literal["segmented", "stacked", "kernel"] | None = Field(
        default=None,
        description="force the LoRA form of decode-sized segments (segmented / stacked / kernel); default: chosen "
        "by measurement at worker start",
    )
    engine_lora_kernel: bool | None = Field(
        default=None,
        description="C/OpenMP CPU kernel for decode-sized LoRA segments (built at start with the system C "
        "compiler, cached); default: on where it builds; false: the torch forms",
    )

    @field_validator("import_allowed_buckets", mode="before")
    @classmethod
    def _split_bucket_names(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @field_validator("placement_policy")
    @classmethod
    def _check_placement_policy(cls, value: str) -> str:
        return _named_choice(value, PLACEMENT_POLICIES, "placement policy")

    @field_validator("router_policy")
    @classmethod
    def _check_router_policy(cls, value: str) -> str:
        return _named_choice(value, ROUTER_POLICIES, "router policy")

    @field_validator("engine_batch_policy")
    @classmethod
    def _check_engine_batch_policy(cls, value: str) -> str:
        return _named_choice(value, BATCH_POLICIES, "batch policy", "LORAHOST_ENGINE_BATCH_POLICY")

    @field_validator("adapter_eviction_policy")
    @classmethod
    def _check_adapter_eviction_policy(cls, value: str) -> str:
        return _named_choice(value, EVICTION_POLICIES, "adapter eviction policy", "LORAHOST_ADAPTER_EVICTION_POLICY")

    @field_validator("length_predictor")
    @classmethod
    def _check_length_predictor(cls, value: str) -> str:
        return _named_choice(value, LENGTH_PREDICTORS, "length predictor", "LORAHOST_LENGTH_PREDICTOR")

    @model_validator(mode="after")
    def _check_predictor_samples(self) -> Settings:
        if self.predictor_max_training_samples < self.predictor_min_training_samples:
            raise ValueError(
                f"predictor_max_training_samples ({self.predictor_max_training_samples}) is below "
                f"predictor_min_training_samples ({self.predictor_min_training_samples}): training would never run; "
                "raise LORAHOST_PREDICTOR_MAX_TRAINING_SAMPLES or lower LORAHOST_PREDICTOR_MIN_TRAINING_SAMPLES"
            )
        return self

    @model_validator(mode="after")
    def _check_usage_lease(self) -> Settings:
        if self.usage_lease_timeout_s <= 2 * self.usage_checkpoint_interval_s:
            raise ValueError(
                f"usage_lease_timeout_s ({self.usage_lease_timeout_s}) must be more than twice "
                f"usage_checkpoint_interval_s ({self.usage_checkpoint_interval_s}), or the usage sweep closes the rows "
                "of live API processes between two lease renewals: raise LORAHOST_USAGE_LEASE_TIMEOUT_S or lower "
                "LORAHOST_USAGE_CHECKPOINT_INTERVAL_S"
            )
        return self

    @model_validator(mode="after")
    def _check_scaling(self) -> Settings:
        if self.scaling_min_workers > self.scaling_max_workers:
            raise ValueError(
                f"scaling_min_workers ({self.scaling_min_workers}) is above scaling_max_workers "
                f"({self.scaling_max_workers}): lower LORAHOST_SCALING_MIN_WORKERS or raise LORAHOST_SCALING_MAX_WORKERS"
            )
        if self.worker_operating_points is not None and (
            not self.worker_operating_points or min(self.worker_operating_points.values()) <= 0
        ):
            raise ValueError(
                'LORAHOST_WORKER_OPERATING_POINTS must map rank buckets to positive tokens/s, e.g. {"8": 900, "64": 600}'
            )
        return self

    def resolved_database_url(self) -> str:
        """The database URL, defaulting to a SQLite file inside data_dir."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'lorahost.db').resolve()}"

    def resolved_blob_store(self) -> str:
        """The blob store location, defaulting to data_dir/blobs."""
        if self.blob_store:
            return self.blob_store
        return str((self.data_dir / "blobs").resolve())

    def resolved_broker_url(self) -> str | None:
        """The Celery broker URL (falls back to the Redis URL)."""
        return self.celery_broker_url or self.redis_url

    def resolved_worker_port(self, default: int = DEFAULT_WORKER_PORT) -> int:
        """The worker port: worker_port when set, else `default` (0 = pick a free port)."""
        return self.worker_port if self.worker_port is not None else default

    def resolved_heartbeat_ttl_s(self) -> float:
        """How long a worker's membership lives without a heartbeat (default 3x the interval)."""
        return self.heartbeat_ttl_s if self.heartbeat_ttl_s is not None else 3 * self.heartbeat_interval_s

    def resolved_worker_view_cache_s(self) -> float:
        """How long the API reuses a worker listing: worker_view_cache_s, at most a quarter of the heartbeat TTL."""
        return min(self.worker_view_cache_s, self.resolved_heartbeat_ttl_s() / 4)

    def resolved_api_instance_id(self, default: str | None = None) -> str:
        """The owner id of this API process's usage rows: api_instance_id, else `default`, else <hostname>-<port>."""
        return self.api_instance_id or default or f"{socket.gethostname()}-{self.port}"

    def resolved_operating_points(self) -> dict[int, float]:
        """The capacity model: rank bucket -> tokens/s per worker (worker_operating_points, else the default
        derivation from worker_tokens_per_s, scheduler.placement.default_operating_points)."""
        return dict(self.worker_operating_points or default_operating_points(self.worker_tokens_per_s))

    def resolved_upload_tmp_dir(self) -> Path:
        """The root of the API's upload scratch folders (default data_dir/upload-tmp)."""
        return self.upload_tmp_dir or (self.data_dir / "upload-tmp")

    def resolved_host_cache_dir(self) -> Path:
        """The worker's adapter file cache directory (default data_dir/host_cache)."""
        return self.host_cache_dir or (self.data_dir / "host_cache")


def _named_choice(value: str, choices: Collection[str], what: str, env: str | None = None) -> str:
    """`value` when it names one of `choices`; else a ValueError that lists the choices (and, given `env`, says
    which variable to set to one of them)."""
    if value not in choices:
        names = ", ".join(sorted(choices))
        fix = f": set {env} to one of {names}" if env else f"; choose one of {names}"
        raise ValueError(f"unknown {what} {value!r}{fix}")
    return value
