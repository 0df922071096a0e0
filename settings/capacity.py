"""The capacity model's sections: adapter placement (`placement`, LoRAServe, scheduler/placement/placement.py),
autoscaling (`scaling`, scheduler/scaling/scaling.py) and the output-length predictor (`predictor`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator

from settings.section import named_choice, section_config

LENGTH_PREDICTORS = ("learned", "max_tokens")  # api/inference/learned_predictor.py, api/inference/predict.py


class PlacementSettings(BaseModel):
    """Demand forecast, placement policy and the capacity model (shared with autoscaling)."""

    model_config = section_config("placement_")

    bucket_s: float = Field(default=60.0, gt=0, description="Demand history bucket length (seconds)")
    history_buckets: int = Field(
        default=10,
        ge=1,
        description="Buckets of usage history the demand forecast (max of EWMA, last bucket) reads",
    )
    ewma_alpha: float = Field(default=0.5, gt=0, le=1, description="EWMA smoothing of the demand forecast")
    policy: str = Field(
        default="demand_only",  # = scheduler/placement/placement_baselines.py DEFAULT_PLACEMENT_POLICY
        description="demand_only (default: no routing rows, the router alone picks among all ready workers; demand "
        "is still published for autoscaling), loraserve (rank-bucketed fractional placement), replicated (holders "
        "per adapter follow its demand, scheduler/placement/replicated_placement.py; route with "
        "holders_least_loaded), or the baselines random | contiguous (one holder per adapter, "
        "scheduler/placement/placement_baselines.py)",
    )
    replication_headroom: float = Field(
        default=1.5,
        gt=0,
        description="replicated placement: an adapter's holders = ceil(its share of the demand x workers x this)",
    )
    replication_hysteresis: float = Field(
        default=0.25,
        ge=0,
        lt=1,
        description="replicated placement: an adapter keeps its h holders until its need falls below h - 1 - this",
    )
    max_worker_rank_sum: int | None = Field(
        default=None,
        gt=0,
        description="replicated placement: adapter memory per worker, as the sum of the LoRA ranks of the adapters "
        "placed on it (an adapter's bytes are proportional to its rank for one base model); None = no limit",
    )
    min_phi: float = Field(
        default=0.05,
        ge=0,
        lt=0.5,
        description="Smallest routing weight of an adapter on a worker (smaller merge)",
    )
    planner_profile: str = Field(
        default="h100-llama3.1-8b-vllm",
        description="Capacity planner (lorahost plan, POST /v1/admin/plan): a shipped twin profile's name "
        "(twin/profiles/NAME.json) or a profile file's path chosen by the operator (POST /v1/admin/plan "
        "takes profile names only: the shipped ones and this one's file name without .json)",
    )
    planner_max_running: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Capacity planner jobs (POST /v1/admin/plan): how many plans run at once (child processes in "
        "embedded mode, Celery tasks otherwise); the others wait in the queue",
    )
    planner_max_queued: int = Field(
        default=4,
        ge=0,
        le=1000,
        description="Capacity planner jobs: how many plans may wait beyond the running ones; past it a new plan is "
        "refused with 429 (wait for one to finish or cancel one)",
    )
    planner_time_limit_s: float = Field(
        default=900.0,
        gt=0,
        description="Capacity planner jobs: seconds a plan may run; past it the job is killed and fails saying so",
    )
    planner_search_max_checks: int = Field(
        default=12,
        ge=0,
        le=1000,
        description="Capacity planner's search (twin/planner/search.py): the most cluster-twin checks of candidate "
        "deployments (workers x max_num_seqs x memory mode x batch policy x placement) one plan makes; 0 = no search",
    )
    planner_search_max_s: float = Field(
        default=300.0,
        gt=0,
        description="Capacity planner's search: wall seconds after which no further twin check starts (one in "
        "flight finishes)",
    )
    planner_cache_dir: Path | None = Field(
        default=None,
        description="Capacity planner: where the surrogate's twin training runs are cached (default: "
        "DATA_DIR/planner)",
    )
    key_prefix: str = Field(
        default="lorahost:placement:", description="Redis key prefix of the routing table"
    )
    worker_tokens_per_s: float = Field(
        default=1000.0,
        gt=0,
        validation_alias="worker_tokens_per_s",
        description="Capacity model: tokens/s (prompt + completion) one worker sustains within the SLO without LoRA; "
        "OP[rank] = this / (1 + 0.016 rank) unless worker_operating_points is set",
    )
    worker_operating_points: dict[int, float] | None = Field(
        default=None,
        validation_alias="worker_operating_points",
        description='Capacity model from a profile: JSON {"<rank bucket>": tokens/s, ...} (its keys are the rank '
        "buckets); overrides worker_tokens_per_s",
    )

    @field_validator("policy")
    @classmethod
    def _check_policy(cls, value: str) -> str:
        from scheduler.placement.placement_baselines import (
            PLACEMENT_POLICIES,  # numpy: loaded when built, not imported
        )

        return named_choice(value, PLACEMENT_POLICIES, "placement policy")

    @field_validator("worker_operating_points")
    @classmethod
    def _check_operating_points(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        if value is not None and (not value or min(value.values()) <= 0):
            raise ValueError(
                'LORAHOST_WORKER_OPERATING_POINTS must map rank buckets to positive tokens/s, e.g. {"8": 900, "64": 600}'
            )
        return value

    def resolved_operating_points(self) -> dict[int, float]:
        """The capacity model: rank bucket -> tokens/s per worker (worker_operating_points, else the default
        derivation from worker_tokens_per_s, scheduler.placement.placement.default_operating_points)."""
        from scheduler.placement.placement import default_operating_points

        return dict(self.worker_operating_points or default_operating_points(self.worker_tokens_per_s))


class ScalingSettings(BaseModel):
    """Autoscaling targets and limits per base model."""

    model_config = section_config("scaling_")

    target_utilisation: float = Field(
        default=0.8, gt=0, le=1, description="Autoscaling: workers are sized to run at this share of capacity"
    )
    min_workers: int = Field(default=0, ge=0, description="Autoscaling: fewest workers per base model")
    max_workers: int = Field(default=8, ge=0, description="Autoscaling: most workers per base model")
    scale_to_zero_idle_s: float = Field(
        default=600.0,
        ge=0,
        validation_alias="scale_to_zero_idle_s",
        description="Autoscaling: a base model with no request for this long goes to 0 workers",
    )
    scale_down_cooldown_s: float = Field(
        default=300.0,
        ge=0,
        validation_alias="scale_down_cooldown_s",
        description="Autoscaling: workers are sized for the peak demand of this window (no scale-down on shorter dips)",
    )
    max_waiting_per_worker: int = Field(
        default=8,
        ge=1,
        description="Autoscaling: more waiting requests per live worker than this adds workers",
    )

    @model_validator(mode="after")
    def _check_worker_range(self) -> ScalingSettings:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"scaling_min_workers ({self.min_workers}) is above scaling_max_workers "
                f"({self.max_workers}): lower LORAHOST_SCALING_MIN_WORKERS or raise LORAHOST_SCALING_MAX_WORKERS"
            )
        return self


class PredictorSettings(BaseModel):
    """The output-length predictor: which one, how the API reloads it, what its training reads."""

    model_config = section_config("predictor_")

    length_predictor: str = Field(
        default="learned",
        validation_alias="length_predictor",
        description=f"API: how a request's output length is predicted, one of {sorted(LENGTH_PREDICTORS)}: learned = "
        "the model trained on usage (hot-reloaded from the blob store; its prior until one is trained), "
        "max_tokens = every request uses all of its max_tokens",
    )
    reload_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="API: seconds between checks for a newer length predictor artifact in the blob store (the first "
        "at startup); 0 = never load one (the prior, fed with this process's finished requests)",
    )
    min_training_samples: int = Field(
        default=200,
        ge=10,
        description="Training is skipped (and logged) with fewer finished requests than this in the training window",
    )
    max_training_samples: int = Field(
        default=20_000,
        gt=0,
        description="Training reads at most this many of the most recent finished requests (a fit of 20k takes a few "
        "CPU seconds)",
    )
    training_window_s: float = Field(
        default=7 * 86400.0, gt=0, description="Training reads finished requests that started this recently"
    )

    @field_validator("length_predictor")
    @classmethod
    def _check_length_predictor(cls, value: str) -> str:
        return named_choice(value, LENGTH_PREDICTORS, "length predictor", "LORAHOST_LENGTH_PREDICTOR")

    @model_validator(mode="after")
    def _check_samples(self) -> PredictorSettings:
        if self.max_training_samples < self.min_training_samples:
            raise ValueError(
                f"predictor_max_training_samples ({self.max_training_samples}) is below "
                f"predictor_min_training_samples ({self.min_training_samples}): training would never run; "
                "raise LORAHOST_PREDICTOR_MAX_TRAINING_SAMPLES or lower LORAHOST_PREDICTOR_MIN_TRAINING_SAMPLES"
            )
        return self
