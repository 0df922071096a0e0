"""API shapes only (request bodies and responses)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from registry.models import Adapter, AdapterVersion

PREFIX_CACHE_NAMESPACE_DOC = (
    "A shared prefix-cache namespace (1-64 of a-z, 0-9, '-', '_', '.'): tenants in the same one reuse each "
    "other's cached prompt KV, and so can tell from their response times which prompts the others sent. null "
    "(the default): the tenant's own namespace, shared with no one."
)


class TenantCreate(BaseModel):
    """POST /v1/admin/tenants."""

    name: str = Field(min_length=1, max_length=200)
    plan_id: str | None = None
    prefix_cache_namespace: str | None = Field(default=None, description=PREFIX_CACHE_NAMESPACE_DOC)


class TenantUpdate(BaseModel):
    """PATCH /v1/admin/tenants/{id}: only the fields sent are changed (plan_id null clears the plan,
    prefix_cache_namespace null puts the tenant back in its own namespace)."""

    is_active: bool | None = None
    plan_id: str | None = None
    prefix_cache_namespace: str | None = Field(default=None, description=PREFIX_CACHE_NAMESPACE_DOC)


class TenantPublic(BaseModel):
    """A tenant as the admin sees it."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    is_active: bool
    plan_id: str | None
    prefix_cache_namespace: str | None  # null: the tenant's own namespace (cached KV shared with no one)
    created_at: datetime


class ApiKeyCreated(BaseModel):
    """The only response that ever contains the key in clear."""

    id: str
    tenant_id: str
    key: str
    created_at: datetime


class ApiKeyRevoked(BaseModel):
    """DELETE /v1/admin/keys/{id}."""

    id: str
    tenant_id: str
    revoked_at: datetime | None


class PricePlanCreate(BaseModel):
    """POST /v1/admin/plans."""

    name: str = Field(min_length=1, max_length=100)
    price_per_1m_prompt_tokens: Decimal = Decimal(0)
    price_per_1m_completion_tokens: Decimal = Decimal(0)
    price_storage_per_adapter_day: Decimal = Decimal(0)
    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_percentile: float = Field(default=99.0, gt=0, le=100)


class PricePlanPublic(PricePlanCreate):
    """A price plan."""

    model_config = ConfigDict(from_attributes=True)

    id: str


class AdapterImport(BaseModel):
    """POST /v1/adapters with a JSON body: import from an s3:// folder or archive."""

    name: str
    source: str
    visibility: Literal["private", "public"] | None = None


class AdapterVersionPublic(BaseModel):
    """One version of an adapter and its lifecycle status."""

    id: str
    number: int
    model: str = Field(description="name@number, usable as the `model` of an inference request")
    status: str
    failure_reason: str | None
    sha256: str | None
    rank: int | None
    alpha: float | None
    target_modules: list[str] | None
    num_bytes: int | None
    created_at: datetime
    finished_at: datetime | None

    @classmethod
    def from_row(cls, adapter: Adapter, version: AdapterVersion) -> AdapterVersionPublic:
        """Build from ORM rows."""
        return cls(
            id=version.id,
            number=version.number,
            model=f"{adapter.name}@{version.number}",
            status=version.status,
            failure_reason=version.failure_reason,
            sha256=version.sha256,
            rank=version.rank,
            alpha=version.alpha,
            target_modules=version.target_modules,
            num_bytes=version.num_bytes,
            created_at=version.created_at,
            finished_at=version.finished_at,
        )


class AdapterPublic(BaseModel):
    """An adapter with its versions, as its owner (or anyone, when public) sees it."""

    id: str
    name: str
    visibility: str
    base_model: str
    owner_tenant_id: str
    latest_ready_version: int | None
    created_at: datetime
    versions: list[AdapterVersionPublic]

    @classmethod
    def from_row(cls, adapter: Adapter, versions: list[AdapterVersion] | None = None) -> AdapterPublic:
        """Build from ORM rows (`versions` defaults to all of the adapter's versions)."""
        shown = adapter.versions if versions is None else versions
        ready = [v.number for v in adapter.versions if v.status == "ready"]
        return cls(
            id=adapter.id,
            name=adapter.name,
            visibility=adapter.visibility,
            base_model=adapter.base_model_name,
            owner_tenant_id=adapter.tenant_id,
            latest_ready_version=max(ready) if ready else None,
            created_at=adapter.created_at,
            versions=[AdapterVersionPublic.from_row(adapter, v) for v in shown],
        )


class UploadAccepted(BaseModel):
    """202 response of POST /v1/adapters: the new version and its status (ready already when inline)."""

    adapter: str
    adapter_id: str
    visibility: str
    version: AdapterVersionPublic


class AdapterDeleted(BaseModel):
    """DELETE /v1/adapters/{name}."""

    id: str
    name: str
    deleted: bool = True


class ListResponse(BaseModel):
    """OpenAI-style list envelope."""

    object: Literal["list"] = "list"
    data: list[Any]


class ModelCard(BaseModel):
    """One entry of GET /v1/models (OpenAI shape plus lorahost fields)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str
    parent: str | None = None
    version: int | None = None
    visibility: str | None = None


# ---- inference (OpenAI-compatible) ---------------------------------------------------------------------


class StreamOptions(BaseModel):
    """`stream_options` of a streamed request."""

    include_usage: bool = False


MAX_SEED = 2**64 - 1  # the engine seeds torch.Generator.manual_seed, which takes 64-bit seeds


class InferenceRequestBase(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions. Unknown fields are kept (extra="allow")
    so the route can name them in its 400 instead of silently ignoring them."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extensions (not in OpenAI's API): ignore_eos keeps generating past the end-of-sequence token;
    # min_tokens is honoured only when trivially true (0, or ignore_eos without stop strings: the completion
    # then always has max_tokens tokens) because the engine has no min_tokens of its own.
    ignore_eos: bool = False
    min_tokens: int | None = Field(default=None, ge=0)
    # Accepted only at their no-op values (the route refuses anything else, naming the field).
    n: int | None = None
    logprobs: Any = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("seed")
    @classmethod
    def _seed_in_range(cls, seed: int | None) -> int | None:
        if seed is not None and not 0 <= seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer from 0 to {MAX_SEED} (2^64 - 1), got {seed}")
        return seed

    def stop_list(self) -> list[str]:
        """`stop` as a list (OpenAI allows one string or up to 4)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(InferenceRequestBase):
    """POST /v1/completions: `prompt` is a string, a list of one string, or token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None


class ChatCompletionRequest(InferenceRequestBase):
    """POST /v1/chat/completions: `messages` rendered with the base model's chat template."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None


class UsagePublic(BaseModel):
    """OpenAI `usage`."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class PeriodQuery(BaseModel):
    """A reporting period [start, end) in UTC."""

    start: datetime
    end: datetime


class PredictionAccuracyPublic(BaseModel):
    """How close output-length predictions came: MAE in tokens and bucket accuracy (prediction and truth in
    the same `bucket_edges` class); both null without samples."""

    num_samples: int
    mae: float | None
    bucket_accuracy: float | None


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

    kind: str  # settings.length_predictor: learned or max_tokens
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
