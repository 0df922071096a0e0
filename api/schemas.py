"""API shapes only (request bodies and responses)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from registry.models import Adapter, AdapterVersion


class TenantCreate(BaseModel):
    """POST /v1/admin/tenants."""

    name: str = Field(min_length=1, max_length=200)
    plan_id: str | None = None


class TenantUpdate(BaseModel):
    """PATCH /v1/admin/tenants/{id}: only the fields sent are changed (plan_id null clears the plan)."""

    is_active: bool | None = None
    plan_id: str | None = None


class TenantPublic(BaseModel):
    """A tenant as the admin sees it."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    is_active: bool
    plan_id: str | None
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
