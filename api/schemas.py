"""API shapes only (request bodies and responses) of the admin and adapter resources: tenants, keys, plans,
adapters, models. The inference requests' shapes are in api/inference/schemas.py, the operator reports' in
api/report_schemas.py."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from api.plan_limits import DEFAULT_MAX_N, DEFAULT_MAX_TOP_LOGPROBS, MAX_N, MAX_TOP_LOGPROBS
from registry.import_sources import S3Credentials
from registry.models import MAX_INTEGER_COLUMN, PRICE_DIGITS, PRICE_PLACES, Adapter, AdapterVersion

# Text the admin API stores or looks up: no control characters (PostgreSQL text cannot hold NUL at all).
PRINTABLE_TEXT = r"^[^\x00-\x1f\x7f]*$"
RecordId = Annotated[str, Field(pattern=PRINTABLE_TEXT)]

MAX_BIGINT_COLUMN = 2**63 - 1  # BigInteger columns

PREFIX_CACHE_NAMESPACE_DOC = (
    "A shared prefix-cache namespace (1-64 of a-z, 0-9, '-', '_', '.'): tenants in the same one reuse each "
    "other's cached prompt KV, and so can tell from their response times which prompts the others sent. null "
    "(the default): the tenant's own namespace, shared with no one."
)


class TenantCreate(BaseModel):
    """POST /v1/admin/tenants."""

    name: str = Field(min_length=1, max_length=200, pattern=PRINTABLE_TEXT)
    plan_id: RecordId | None = None
    prefix_cache_namespace: str | None = Field(default=None, description=PREFIX_CACHE_NAMESPACE_DOC)


class TenantUpdate(BaseModel):
    """PATCH /v1/admin/tenants/{id}: only the fields sent are changed (plan_id null clears the plan,
    prefix_cache_namespace null puts the tenant back in its own namespace)."""

    is_active: bool | None = None
    plan_id: RecordId | None = None
    prefix_cache_namespace: str | None = Field(default=None, description=PREFIX_CACHE_NAMESPACE_DOC)
    can_manage_keys: bool | None = Field(
        default=None, description="let the tenant create and revoke its own API keys in the console"
    )


class TenantPublic(BaseModel):
    """A tenant as the admin sees it."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    is_active: bool
    plan_id: str | None
    prefix_cache_namespace: str | None  # null: the tenant's own namespace (cached KV shared with no one)
    can_manage_keys: bool  # the tenant may create and revoke its own keys in the console
    created_at: datetime


class ApiKeyCreated(BaseModel):
    """The only response that ever contains the key in clear."""

    id: str
    tenant_id: str
    key: str
    created_at: datetime


class ApiKeyRevoked(BaseModel):
    """DELETE /v1/admin/keys/{id} and DELETE /v1/keys/{id}."""

    id: str
    tenant_id: str
    revoked_at: datetime | None


class ApiKeyPublic(BaseModel):
    """One of the tenant's keys as GET /v1/keys lists it (never the key itself)."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    created_at: datetime
    revoked_at: datetime | None


# Plan values as the admin may set them: what the columns hold and what makes sense (a limit of 0 or below
# would refuse everything: leave it null for "no limit").
PlanLimit = Annotated[int, Field(gt=0, le=MAX_INTEGER_COLUMN)]
Price = Annotated[
    Decimal, Field(ge=0, max_digits=PRICE_DIGITS, decimal_places=PRICE_PLACES, allow_inf_nan=False)
]
SloTargetMs = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# A plan's fair-share weight (scheduler/admission/fair_share.py): its tenants' share of each engine relative to weight 1.
# Bounded both ways so one plan's tenants get at most a million times another's share (the counters divide
# by the weight: a weight near 0 would make one tenant's counter jump past everyone's on its first token).
MIN_FAIR_SHARE_WEIGHT, MAX_FAIR_SHARE_WEIGHT = 0.001, 1000.0
FairShareWeight = Annotated[
    float, Field(ge=MIN_FAIR_SHARE_WEIGHT, le=MAX_FAIR_SHARE_WEIGHT, allow_inf_nan=False)
]


class PricePlanCreate(BaseModel):
    """POST /v1/admin/plans: prices >= 0 with at most 6 decimals, limits and SLO targets positive (null: none)."""

    name: str = Field(min_length=1, max_length=100, pattern=PRINTABLE_TEXT)
    price_per_1m_prompt_tokens: Price = Decimal(0)
    price_per_1m_completion_tokens: Price = Decimal(0)
    price_storage_per_adapter_day: Price = Decimal(0)
    requests_per_min: PlanLimit | None = None
    tokens_per_min: PlanLimit | None = None
    max_concurrent_requests: PlanLimit | None = Field(
        default=None,
        description="most requests a tenant of this plan may have in flight at once (429 above it); null: no cap",
    )
    fair_share_weight: FairShareWeight | None = Field(
        default=None,
        description=f"a tenant's share of each worker's engine under fair share, relative to weight 1 (2: twice "
        f"the tokens of a weight-1 tenant while both are backlogged); {MIN_FAIR_SHARE_WEIGHT} to "
        f"{MAX_FAIR_SHARE_WEIGHT:g}; null: 1",
    )
    max_n: int | None = Field(
        default=None,
        ge=1,
        le=MAX_N,
        description=f"most choices (`n`) one inference request may ask for (400 above it); null: {DEFAULT_MAX_N}",
    )
    max_top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="most top_logprobs (completions: logprobs) one inference request may ask for (400 above "
        f"it); null: {DEFAULT_MAX_TOP_LOGPROBS}",
    )
    slo_ttft_ms: SloTargetMs | None = None
    slo_tpot_ms: SloTargetMs | None = None
    slo_percentile: float = Field(default=99.0, gt=0, le=100)
    uploads_per_min: int | None = Field(
        default=None,
        ge=0,
        le=MAX_INTEGER_COLUMN,
        description="Upload quota: POST /v1/adapters calls (uploads and imports) per minute; null = unlimited",
    )
    max_adapters: int | None = Field(
        default=None,
        ge=0,
        le=MAX_INTEGER_COLUMN,
        description="Upload quota: live (not deleted) adapters; a new version of an existing adapter does not "
        "count; null = unlimited",
    )
    max_stored_bytes: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BIGINT_COLUMN,
        description="Upload quota: bytes of adapter_model.safetensors over every version of the tenant's live "
        "adapters that is not failed; null = unlimited",
    )


class PricePlanPublic(BaseModel):
    """A price plan as stored (without PricePlanCreate's checks: rows written before them still list)."""

    model_config = ConfigDict(from_attributes=True)

    name: str
    price_per_1m_prompt_tokens: Decimal
    price_per_1m_completion_tokens: Decimal
    price_storage_per_adapter_day: Decimal
    requests_per_min: int | None
    tokens_per_min: int | None
    max_concurrent_requests: int | None
    fair_share_weight: float | None
    max_n: int | None
    max_top_logprobs: int | None
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    slo_percentile: float
    uploads_per_min: int | None
    max_adapters: int | None
    max_stored_bytes: int | None
    id: str


class S3ImportCredentials(BaseModel):
    """A tenant's own S3 credentials for one s3:// import: used for that read only, never stored, logged or
    returned."""

    access_key_id: str = Field(min_length=1, max_length=256)
    secret_access_key: SecretStr = Field(min_length=1, max_length=1024)
    session_token: SecretStr | None = Field(default=None, max_length=8192)
    endpoint_url: str | None = Field(
        default=None,
        max_length=2048,
        description="https://host[:port] of an S3-compatible store; default: the platform's",
    )
    region: str | None = Field(default=None, max_length=64)

    def to_credentials(self) -> S3Credentials:
        """The registry's plain form."""
        return S3Credentials(
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key.get_secret_value(),
            session_token=self.session_token.get_secret_value() if self.session_token else None,
            endpoint_url=self.endpoint_url,
            region=self.region,
        )


class AdapterImport(BaseModel):
    """POST /v1/adapters with a JSON body: import from a presigned https URL of one archive, from an s3://
    folder or archive with your own `credentials` (or from a bucket the operator allow-lists), or from a
    Hugging Face Hub repository, hf://org/name[@revision], with your own `hf_token` when it is private."""

    name: str
    source: str = Field(
        max_length=8192,
        description="https://.../adapter.zip|.tar.gz|.tar (e.g. a presigned S3 URL), s3://bucket/folder, "
        "s3://bucket/key.zip|.tar.gz|.tar, or hf://org/name[@revision] (a branch, a tag or a commit)",
    )
    visibility: Literal["private", "public"] | None = None
    credentials: S3ImportCredentials | None = None
    hf_token: SecretStr | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="your own Hugging Face token, for a private or gated hf:// repository: used for this import "
        "only, never stored, logged or returned (without it the repository is read with no token at all)",
    )
    base_model: str | None = Field(
        default=None,
        max_length=200,
        description="the base model the adapter is for (GET /v1/models); default: the one its "
        "adapter_config.json names, or the only one served",
    )


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
    source_revision: str | None = Field(
        description="the commit an hf:// import read (its revision resolved when imported); null otherwise"
    )
    use_dora: bool = Field(
        description="a DoRA adapter (peft use_dora): served by native workers only, never by the vLLM engine"
    )
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
            source_revision=version.source_revision,
            use_dora=version.use_dora,
            created_at=version.created_at,
            finished_at=version.finished_at,
        )


class AdapterPublic(BaseModel):
    """An adapter with its versions, as its owner (or anyone, when public) sees it."""

    id: str
    name: str
    visibility: str
    base_model: str
    owner: str = Field(description="the owning tenant's name")
    owner_tenant_id: str | None = Field(
        description="the owning tenant's id, shown to the owner only (null on another tenant's public adapter)"
    )
    latest_ready_version: int | None
    created_at: datetime
    versions: list[AdapterVersionPublic]

    @classmethod
    def from_row(
        cls, adapter: Adapter, versions: list[AdapterVersion] | None = None, *, viewer_tenant_id: str
    ) -> AdapterPublic:
        """Build from ORM rows as `viewer_tenant_id` sees it (`versions` defaults to all of them)."""
        shown = adapter.versions if versions is None else versions
        ready = [v.number for v in adapter.versions if v.status == "ready"]
        return cls(
            id=adapter.id,
            name=adapter.name,
            visibility=adapter.visibility,
            base_model=adapter.base_model_name,
            owner=adapter.tenant.name,
            owner_tenant_id=adapter.tenant_id if adapter.tenant_id == viewer_tenant_id else None,
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


class CatalogModelPublic(BaseModel):
    """A base model of the catalog (GET /v1/admin/models)."""

    model_config = ConfigDict(from_attributes=True)

    name: str
    model_type: str
    shape: dict[str, int]
    dtype: str
    files: list[dict[str, Any]]
    num_bytes: int
    engines: list[str]
    aliases: list[str]
    status: str
    created_at: datetime
    prices: dict[str, dict[str, str]] | None = None
    num_ready_adapters: int = 0


class TokenPrices(BaseModel):
    """A base model's own token prices for a plan (currency units per 1M tokens; unset: the plan's)."""

    model_config = ConfigDict(extra="forbid")

    per_1m_prompt: Decimal | None = Field(default=None, ge=0, le=Decimal(10**9))
    per_1m_completion: Decimal | None = Field(default=None, ge=0, le=Decimal(10**9))


class CatalogModelUpdate(BaseModel):
    """PATCH /v1/admin/models/{name}: the model's own prices, by plan name or "*" (every plan); null: the plans'
    prices again."""

    model_config = ConfigDict(extra="forbid")

    prices: dict[Annotated[str, Field(min_length=1, max_length=64)], TokenPrices] | None


class ListResponse(BaseModel):
    """OpenAI-style list envelope."""

    object: Literal["list"] = "list"
    data: list[Any]


class PageResponse(ListResponse):
    """OpenAI's paginated list envelope (api/pagination.py): one page of `data`, the ids of its first and last
    items (null on an empty page) and whether more follow: pass `last_id` as `after` for the next page."""

    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


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
