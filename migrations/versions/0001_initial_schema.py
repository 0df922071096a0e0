"""Initial schema: price plans, tenants, API keys, adapters, adapter versions, usage records.

Revision ID: 0001
Revises:
Create Date: 2026-11-21 23:13:18.723732
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "price_plans",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("price_per_1m_prompt_tokens", sa.Numeric(precision=18, scale=6), nullable=False),
        sa.Column("price_per_1m_completion_tokens", sa.Numeric(precision=18, scale=6), nullable=False),
        sa.Column("price_storage_per_adapter_day", sa.Numeric(precision=18, scale=6), nullable=False),
        sa.Column("requests_per_min", sa.Integer(), nullable=True),
        sa.Column("tokens_per_min", sa.Integer(), nullable=True),
        sa.Column("slo_ttft_ms", sa.Float(), nullable=True),
        sa.Column("slo_tpot_ms", sa.Float(), nullable=True),
        sa.Column("slo_percentile", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_price_plans")),
        sa.UniqueConstraint("name", name=op.f("uq_price_plans_name")),
    )
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("is_active", sa.Boolean(), nullable=False),
        sa.Column("plan_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["price_plans.id"], name=op.f("fk_tenants_plan_id_price_plans"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
    )
    op.create_table(
        "adapters",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("visibility", sa.String(length=16), nullable=False),
        sa.Column("base_model_name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("visibility IN ('private', 'public')", name=op.f("ck_adapters_visibility")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_adapters_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
    )
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_adapters_tenant_id"), ["tenant_id"], unique=False)
        batch_op.create_index(
            "uq_adapters_tenant_name_live",
            ["tenant_id", "name"],
            unique=True,
            postgresql_where=sa.text("deleted_at IS NULL"),
            sqlite_where=sa.text("deleted_at IS NULL"),
        )

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("salt", sa.String(length=64), nullable=False),
        sa.Column("secret_hash", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "adapter_versions",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("adapter_id", sa.String(length=36), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("source_uri", sa.Text(), nullable=True),
        sa.Column("config_blob_key", sa.String(length=500), nullable=True),
        sa.Column("weights_blob_key", sa.String(length=500), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("alpha", sa.Float(), nullable=True),
        sa.Column("target_modules", sa.JSON(), nullable=True),
        sa.Column("num_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('uploading', 'validating', 'ready', 'failed')",
            name=op.f("ck_adapter_versions_status"),
        ),
        sa.ForeignKeyConstraint(
            ["adapter_id"],
            ["adapters.id"],
            name=op.f("fk_adapter_versions_adapter_id_adapters"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapter_versions")),
        sa.UniqueConstraint("adapter_id", "number", name="uq_adapter_versions_adapter_number"),
    )
    with op.batch_alter_table("adapter_versions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_adapter_versions_adapter_id"), ["adapter_id"], unique=False)

    op.create_table(
        "usage_records",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("request_id", sa.String(length=100), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("adapter_id", sa.String(length=36), nullable=True),
        sa.Column("adapter_version_id", sa.String(length=36), nullable=True),
        sa.Column("model_name", sa.String(length=200), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("tpot_ms", sa.Float(), nullable=True),
        sa.Column("e2e_ms", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('ok', 'error', 'aborted', 'rejected')", name=op.f("ck_usage_records_status")
        ),
        sa.ForeignKeyConstraint(
            ["adapter_id"],
            ["adapters.id"],
            name=op.f("fk_usage_records_adapter_id_adapters"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["adapter_version_id"],
            ["adapter_versions.id"],
            name=op.f("fk_usage_records_adapter_version_id_adapter_versions"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_usage_records_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
        sa.UniqueConstraint("request_id", name=op.f("uq_usage_records_request_id")),
    )
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.create_index("ix_usage_records_tenant_started", ["tenant_id", "started_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_records_tenant_started")

    op.drop_table("usage_records")
    with op.batch_alter_table("adapter_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_adapter_versions_adapter_id"))

    op.drop_table("adapter_versions")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant_id"))

    op.drop_table("api_keys")
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_adapters_tenant_name_live",
            postgresql_where=sa.text("deleted_at IS NULL"),
            sqlite_where=sa.text("deleted_at IS NULL"),
        )
        batch_op.drop_index(batch_op.f("ix_adapters_tenant_id"))

    op.drop_table("adapters")
    op.drop_table("tenants")
    op.drop_table("price_plans")
