"""The operator reports' shapes: the length predictor's accuracy, the published placement and the autoscaling
decisions (GET /v1/admin/predictor, /v1/admin/placement, /v1/admin/scaling)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class PredictionAccuracyPublic(BaseModel):
    """How close output-length predictions came: MAE in tokens and bucket accuracy (prediction and truth in
    the same `bucket_edges` class), both null without samples; and what ordering requests by size needs
    (scheduler/length/length_metrics.py): `spearman`, the rank correlation of predicted and true lengths (1: the same
    order; null with fewer than 2 samples or a constant side, or in a model trained before it was reported),
    `bucket_recall[b]`, the share of requests truly in bucket b that were predicted there (null: no such
    request), and `bucket_num_samples[b]`, how many requests were truly in bucket b (one entry per bucket:
    len(bucket_edges) + 1)."""

    num_samples: int
    mae: float | None
    bucket_accuracy: float | None
    spearman: float | None = None
    bucket_recall: list[float | None] = Field(default_factory=list)
    bucket_num_samples: list[int] = Field(default_factory=list)


class AdapterPredictionAccuracy(PredictionAccuracyPublic):
    """One adapter version's served predictions (the predictor's key; null ids: the base model)."""

    adapter_version_id: str | None
    adapter_id: str | None
    adapter_name: str | None  # the usage rows' model name: the adapter's name, or the base model's


class HeldoutAccuracy(PredictionAccuracyPublic):
    """The served model's accuracy on its training's held-out split, for one adapter key."""

    adapter_key: str | None


class PredictorModelPublic(BaseModel):
    """The length predictor this API process serves."""

    kind: str  # settings.predictor.length_predictor: learned or max_tokens
    version: str  # the model version; "prior" before a trained model is loaded
    trained_at: datetime | None = None
    num_samples: int | None = None
    num_training_samples: int | None = None
    num_heldout_samples: int | None = None
    heldout: PredictionAccuracyPublic | None = None
    heldout_per_adapter: list[HeldoutAccuracy] = Field(default_factory=list)


class PredictorReport(BaseModel):
    """GET /v1/admin/predictor: the served model and the accuracy of the predictions recorded in usage rows
    (finished `ok` requests that started in [start, end)), overall and per adapter version."""

    object: Literal["predictor"] = "predictor"
    model: PredictorModelPublic
    start: datetime
    end: datetime
    bucket_edges: list[int]
    overall: PredictionAccuracyPublic
    data: list[AdapterPredictionAccuracy]


class RoutingWeightPublic(BaseModel):
    """One holder of an adapter in the routing table."""

    worker_id: str
    weight: float


class WorkerPlacementPublic(BaseModel):
    """A worker's share of the placement: load in server-equivalents (1 = its capacity within the SLO), max
    rank bucket of its adapters with demand, number of adapters assigned."""

    worker_id: str
    base_model: str
    load: float
    max_rank: int
    num_adapters: int


class PlacementReport(BaseModel):
    """GET /v1/admin/placement: the published routing table (version 0 and no rows before the first run)."""

    object: Literal["placement"] = "placement"
    version: int
    computed_at: datetime | None
    table: dict[str, list[RoutingWeightPublic]]
    workers: list[WorkerPlacementPublic]
    moved: list[str]


class ScalingDecisionPublic(BaseModel):
    """GET /v1/admin/scaling?base_model=NAME (and one item of the list): how many workers the base model
    should run (a KEDA metrics-api trigger reads `desired_workers`), how many are live, the forecast demand
    and why."""

    base_model: str
    desired_workers: int
    live_workers: int
    demand_tokens_per_s: float
    reason: str


class ScalingReport(BaseModel):
    """GET /v1/admin/scaling: one decision per base model with workers, demand or waiting requests."""

    base_models: list[ScalingDecisionPublic]


class PlanRequest(BaseModel):
    """POST /v1/admin/plan: plan GPUs for the demand recorded over the last `window_s` (or for `workload`, a
    workload file's content, twin/planner/workload.py) on a twin `profile` (a NAME: a shipped
    profile's or settings.placement.planner_profile's file name, its default; never a path), within `slo`
    ("ttft_p99=2s"). Queued as a job (api/routes/plan.py)."""

    model_config = {"extra": "forbid"}

    window_s: float = Field(default=3600.0, gt=0, le=30 * 86400)
    workload: dict[str, object] | None = None
    profile: str | None = Field(
        default=None, min_length=1, max_length=200, description="A twin profile's name (not a path)"
    )
    slo: str | None = Field(default=None, max_length=100)
    objective: Literal["throughput", "latency"] = "throughput"
    form: Literal["forest", "tree"] = "forest"
    num_samples: int = Field(default=150, ge=8, le=2000, description="Twin training runs (cached)")
    check_s: float = Field(
        default=30.0, gt=0, le=600, description="Simulated seconds of the twin check per GPU"
    )
    baselines: bool = False
    max_checks: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="The search's most cluster-twin checks (0: no search; default "
        "LORAHOST_PLACEMENT_PLANNER_SEARCH_MAX_CHECKS); the search runs when an `slo` is given",
    )
    max_search_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="The search's wall seconds (default LORAHOST_PLACEMENT_PLANNER_SEARCH_MAX_S)",
    )
    gpu_price_per_hour: float = Field(
        default=1.0, gt=0, description="A worker's price per hour: the search's cost (default 1: GPU-hours)"
    )
