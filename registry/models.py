"""SQLAlchemy 2 tables: tenants, API keys, adapters and their versions, usage records, price plans.

Public ids are UUID strings (String(36)) so the same schema runs on PostgreSQL and SQLite.
Enumerations are plain strings guarded by named CHECK constraints (portable, readable in SQL).
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    Float,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

# Base, UTCDateTime, new_id and utcnow are also imported from here, with the tables.
from registry.model_base import Base, UTCDateTime, in_check, new_id, utcnow

VISIBILITIES = ("private", "public")
VERSION_STATUSES = ("uploading", "validating", "ready", "failed")
# in_progress: the request is running (its row is written when it starts and checkpointed as it streams);
# interrupted: the API process (or the request's worker) died first; closed with its last checkpoint.
USAGE_STATUSES = ("ok", "error", "aborted", "rejected", "in_progress", "interrupted")
OPEN_USAGE_STATUS = "in_progress"
INTERRUPTED_USAGE_STATUS = "interrupted"


# Column ranges the admin API checks before writing (api/schemas.py): Integer is 32-bit on PostgreSQL, and prices
# are Numeric(PRICE_DIGITS, PRICE_PLACES).
MAX_INTEGER_COLUMN = 2**31 - 1
PRICE_DIGITS, PRICE_PLACES = 18, 6


class PricePlan(Base):
    """Prices, rate limits, upload quotas and SLO targets a tenant is billed and measured against."""

    __tablename__ = "price_plans"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    price_per_1m_prompt_tokens: Mapped[Decimal] = mapped_column(
        Numeric(PRICE_DIGITS, PRICE_PLACES), default=Decimal(0)
    )
    price_per_1m_completion_tokens: Mapped[Decimal] = mapped_column(
        Numeric(PRICE_DIGITS, PRICE_PLACES), default=Decimal(0)
    )
    price_storage_per_adapter_day: Mapped[Decimal] = mapped_column(
        Numeric(PRICE_DIGITS, PRICE_PLACES), default=Decimal(0)
    )
    requests_per_min: Mapped[int | None] = mapped_column(Integer)
    tokens_per_min: Mapped[int | None] = mapped_column(Integer)
    max_concurrent_requests: Mapped[int | None] = mapped_column(Integer)  # a tenant's requests in flight
    # a tenant's share of each engine under fair share (scheduler/admission/fair_share.py); None = 1, an equal share
    fair_share_weight: Mapped[float | None] = mapped_column(Float)
    # Caps on one request's n and top_logprobs (api/plan_limits.py); None = the defaults there (8 and 20).
    max_n: Mapped[int | None] = mapped_column(Integer)
    max_top_logprobs: Mapped[int | None] = mapped_column(Integer)
    slo_ttft_ms: Mapped[float | None] = mapped_column(Float)
    slo_tpot_ms: Mapped[float | None] = mapped_column(Float)
    slo_percentile: Mapped[float] = mapped_column(Float, default=99.0)
    # Upload quotas (registry/upload_quota.py); None = unlimited.
    uploads_per_min: Mapped[int | None] = mapped_column(Integer)
    max_adapters: Mapped[int | None] = mapped_column(Integer)  # live (not deleted) adapters
    max_stored_bytes: Mapped[int | None] = mapped_column(BigInteger)  # weights of live, non-failed versions
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Tenant(Base):
    """A customer account; owns API keys and adapters."""

    __tablename__ = "tenants"
    __table_args__ = (Index("ix_tenants_created_at_id", "created_at", "id"),)  # list pages

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    plan_id: Mapped[str | None] = mapped_column(ForeignKey("price_plans.id", ondelete="SET NULL"))
    # The shared prefix-cache namespace an operator put this tenant in (admin API only, never the tenant's own
    # choice); NULL: the tenant's own namespace, so no other tenant can hit (and time) its cached KV blocks.
    prefix_cache_namespace: Mapped[str | None] = mapped_column(String(64))
    # The operator lets the tenant create and revoke its own API keys in the console (default: only the operator)
    can_manage_keys: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    plan: Mapped[PricePlan | None] = relationship()


class ApiKey(Base):
    """A tenant API key. Only a salted HMAC-SHA256 of the secret is stored; the key is shown once."""

    __tablename__ = "api_keys"
    __table_args__ = (Index("ix_api_keys_tenant_created", "tenant_id", "created_at", "id"),)  # list pages

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    salt: Mapped[str] = mapped_column(String(64))
    secret_hash: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    tenant: Mapped[Tenant] = relationship()


CONSOLE_ROLES = ("tenant", "operator")


class ConsoleSessionRecord(Base):
    """A signed-in console session (api/console/session.py), server side so that it can end: only a SHA-256 of
    its random session id is stored (the cookie carries the id, signed). A tenant's session names the key it
    signed in with; the operator's names neither tenant nor key. Sign-out sets revoked_at; rows that expired
    or were revoked are deleted on later sign-ins (registry/console_sessions.py)."""

    __tablename__ = "console_sessions"
    __table_args__ = (CheckConstraint(in_check("role", CONSOLE_ROLES), name="role"),)

    session_id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


BASE_MODEL_STATUSES = ("ready", "removed")


class CatalogModel(Base):
    """A base model of the catalog: its shape, its files in the blob store (content-addressed, with digests) and
    the engines that may serve it. Removed models keep their row (status "removed") for usage history."""

    __tablename__ = "base_models"
    __table_args__ = (
        CheckConstraint(in_check("status", BASE_MODEL_STATUSES), name="status"),
        # One live model per name; a removed name can be added again.
        Index(
            "uq_base_models_name_live",
            "name",
            unique=True,
            postgresql_where=text("status = 'ready'"),
            sqlite_where=text("status = 'ready'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64))
    model_type: Mapped[str] = mapped_column(String(32))  # config.json's model_type: llama, mistral, qwen2
    shape: Mapped[dict[str, int]] = mapped_column(JSON)  # hidden_size, num_layers, heads, vocab_size, ...
    dtype: Mapped[str] = mapped_column(String(16))
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{path, sha256, num_bytes, blob_key}]
    num_bytes: Mapped[int] = mapped_column(BigInteger)
    engines: Mapped[list[str]] = mapped_column(JSON)  # engine backends that may serve it
    aliases: Mapped[list[str]] = mapped_column(JSON)  # other names adapters' configs use for it
    # plan name or "*" -> {"per_1m_prompt": "0.1", "per_1m_completion": "0.2"}; None: the plans' prices
    prices: Mapped[dict[str, dict[str, str]] | None] = mapped_column(JSON)
    # "<layer>.<module>" -> Frobenius norm of the base weight: bounds adapters' updates without the weights
    weight_norms: Mapped[dict[str, float] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="ready")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class BaseModelName(Base):
    """A name or alias of a base model, case-folded (registry/model_names.py): the primary key makes every
    name and alias unique across the catalog, removed models included (their names stay reserved)."""

    __tablename__ = "base_model_names"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("base_models.id", ondelete="CASCADE"), index=True)
    is_alias: Mapped[bool] = mapped_column(Boolean, default=False)

    model: Mapped[CatalogModel] = relationship()


PUBLIC_LIVE_ADAPTER = "visibility = 'public' AND deleted_at IS NULL"


class Adapter(Base):
    """A named LoRA adapter of one tenant; its files live in versions. Soft-deleted via deleted_at."""

    __tablename__ = "adapters"
    __table_args__ = (
        CheckConstraint(in_check("visibility", VISIBILITIES), name="visibility"),
        # One live adapter per (tenant, name); a soft-deleted name can be reused.
        Index(
            "uq_adapters_tenant_name_live",
            "tenant_id",
            "name",
            unique=True,
            postgresql_where=text("deleted_at IS NULL"),
            sqlite_where=text("deleted_at IS NULL"),
        ),
        # Public live adapters in (name, created_at, id) order: the public half of the adapter and model lists
        # (registry/adapter_pages.py, registry/model_pages.py) and the oldest public adapter of a name.
        Index(
            "ix_adapters_public_name",
            "name",
            "created_at",
            "id",
            postgresql_where=text(PUBLIC_LIVE_ADAPTER),
            sqlite_where=text(PUBLIC_LIVE_ADAPTER),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    visibility: Mapped[str] = mapped_column(String(16), default="private")
    base_model_name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    tenant: Mapped[Tenant] = relationship()
    versions: Mapped[list[AdapterVersion]] = relationship(
        back_populates="adapter", order_by="AdapterVersion.number"
    )


class AdapterVersion(Base):
    """One uploaded revision of an adapter: blob keys, checksum, LoRA shape and lifecycle status."""

    __tablename__ = "adapter_versions"
    __table_args__ = (
        UniqueConstraint("adapter_id", "number", name="uq_adapter_versions_adapter_number"),
        CheckConstraint(in_check("status", VERSION_STATUSES), name="status"),
        # An adapter's ready versions by number: whether it has one, and its latest (registry/model_pages.py).
        Index(
            "ix_adapter_versions_ready",
            "adapter_id",
            "number",
            postgresql_where=text("status = 'ready'"),
            sqlite_where=text("status = 'ready'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    adapter_id: Mapped[str] = mapped_column(ForeignKey("adapters.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="validating")
    failure_reason: Mapped[str | None] = mapped_column(Text)
    source_uri: Mapped[str | None] = mapped_column(Text)
    source_revision: Mapped[str | None] = mapped_column(String(40))  # the commit a Hub import read (0025)
    config_blob_key: Mapped[str | None] = mapped_column(String(500))
    weights_blob_key: Mapped[str | None] = mapped_column(String(500))
    sha256: Mapped[str | None] = mapped_column(String(64))  # of adapter_model.safetensors
    config_sha256: Mapped[str | None] = mapped_column(String(64))  # of adapter_config.json (None before 0002)
    rank: Mapped[int | None] = mapped_column(Integer)
    alpha: Mapped[float | None] = mapped_column(Float)
    # DoRA (peft use_dora): only native workers serve it (scheduler/routing/router.py DORA_ENGINES); since 0025
    use_dora: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    target_modules: Mapped[list[str] | None] = mapped_column(JSON)
    num_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    adapter: Mapped[Adapter] = relationship(back_populates="versions")


USAGE_FILLFACTOR = 80  # percent of a usage_records page filled by inserts (PostgreSQL)


class UsageRecord(Base):
    """One inference request's metering row: written `in_progress` when the request starts, checkpointed
    while it streams and updated to its final status before the response stream closes (api/metering.py)."""

    __tablename__ = "usage_records"
    __table_args__ = (
        CheckConstraint(in_check("status", USAGE_STATUSES), name="status"),
        Index("ix_usage_records_tenant_started", "tenant_id", "started_at"),
        Index("ix_usage_records_started", "started_at"),  # billing's period scans (registry/billing.py)
        # The restart, the lease renewals and the usage sweep look only at the few open rows.
        Index(
            "ix_usage_records_open_owner",
            "api_instance_id",
            postgresql_where=text(f"status = '{OPEN_USAGE_STATUS}'"),
            sqlite_where=text(f"status = '{OPEN_USAGE_STATUS}'"),
        ),
        # open rows are updated every checkpoint: room for their new versions in the same page (migration 0027)
        {"postgresql_with": {"fillfactor": USAGE_FILLFACTOR}},
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    request_id: Mapped[str] = mapped_column(String(100), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    adapter_id: Mapped[str | None] = mapped_column(ForeignKey("adapters.id", ondelete="SET NULL"))
    adapter_version_id: Mapped[str | None] = mapped_column(
        ForeignKey("adapter_versions.id", ondelete="SET NULL")
    )
    model_name: Mapped[str] = mapped_column(String(200))
    base_model_name: Mapped[str | None] = mapped_column(String(200))  # NULL: base requests from before 0016
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # The output length the API predicted when it admitted the request (api/inference/predict.py; max_tokens
    # until a predictor is plugged in), next to the true count, completion_tokens. NULL: refused before it.
    predicted_output_tokens: Mapped[int | None] = mapped_column(Integer)
    # What the predictor knew at admission, for its training job (registry/predictor_training.py); NULL:
    # refused before the prediction, or written before migration 0007. Nothing derived from the prompt's
    # content is stored: its size is prompt_tokens. `prompt_features` is always NULL (it held a hashed word
    # n-gram histogram of the prompt; migration 0012 cleared it): kept as a column so an API replica of the
    # previous release can still insert during a rolling upgrade; drop it in a later migration.
    max_tokens: Mapped[int | None] = mapped_column(Integer)
    is_chat: Mapped[bool | None] = mapped_column(Boolean)
    has_stop: Mapped[bool | None] = mapped_column(Boolean)
    prompt_features: Mapped[str | None] = mapped_column(Text)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    tpot_ms: Mapped[float | None] = mapped_column(Float)
    e2e_ms: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))
    worker_id: Mapped[str | None] = mapped_column(String(200))
    # The API process that opened the row (settings.api.api_instance_id): only it closes the row after a restart.
    api_instance_id: Mapped[str | None] = mapped_column(String(200))
    error_message: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # When the row's tokens were last checkpointed (streams): an `interrupted` row is billed as of this moment.
    checkpointed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The owner's lease: set when the row is opened and renewed every quarter lease while the owner
    # process lives (streamed or not); a row whose lease is older than settings.metering.lease_timeout_s is closed
    # `interrupted` by the usage sweep (its owner died, or came back under another api_instance_id).
    lease_renewed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class UsageDay(Base):
    """The usage rows of one settled UTC day summed per (tenant, model name, base model, status) by the usage
    rollup (registry/usage_rollup.py); exact against the raw rows while the day is in rolled_usage_days."""

    __tablename__ = "usage_days"
    __table_args__ = (Index("ix_usage_days_day", "day"),)  # billing's period sums across tenants

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    model_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    base_model_name: Mapped[str] = mapped_column(String(200), primary_key=True)  # "" for rows without one
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    num_requests: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    first_started_at: Mapped[datetime] = mapped_column(UTCDateTime())  # which base a (day, model) names first


class RolledUsageDay(Base):
    """A UTC day whose usage rows usage_days holds, summed when it was settled (no open row, a margin past its
    end); a later change to one of its rows deletes this mark with the day's sums in the same transaction."""

    __tablename__ = "rolled_usage_days"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    rolled_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


# A capacity plan job (POST /v1/admin/plan): queued -> running -> succeeded | failed | cancelled.
PLAN_JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
PLAN_JOB_ACTIVE_STATUSES = ("queued", "running")


class PlanJob(Base):
    """One capacity-planner run (jobs/plan_runner.py): the inputs the API resolved and checked (the job needs
    no DB), its status and, when it succeeded, the plan; the first terminal status written wins."""

    __tablename__ = "plan_jobs"
    __table_args__ = (
        CheckConstraint(in_check("status", PLAN_JOB_STATUSES), name="status"),
        Index("ix_plan_jobs_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    runner: Mapped[str] = mapped_column(String(16))  # "embedded" (a child of an API process) or "celery"
    # The embedded runner's API process (settings.api.api_instance_id): on start it fails what it left behind.
    owner: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Past this an unfinished job's runner is taken for dead: the job reads as failed (registry/plan_jobs.py).
    deadline_at: Mapped[datetime] = mapped_column(UTCDateTime())
