"""The daily usage rollup (issue 38 item 3): usage_days holds each settled UTC day's usage rows summed per
(tenant, model name, base model, status), rolled_usage_days the days it holds (registry/usage_rollup.py). The
usage sweep fills them from the next run on; until a day is rolled every reader sums its raw rows, as before.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 23:15:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_days",
        sa.Column("tenant_id", sa.String(36), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("model_name", sa.String(200), nullable=False),
        sa.Column("base_model_name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("num_requests", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("first_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_usage_days_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "day", "model_name", "base_model_name", "status", name=op.f("pk_usage_days")
        ),
    )
    op.create_index(op.f("ix_usage_days_day"), "usage_days", ["day"])
    op.create_table(
        "rolled_usage_days",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("rolled_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("day", name=op.f("pk_rolled_usage_days")),
    )


def downgrade() -> None:
    op.drop_table("rolled_usage_days")
    op.drop_index(op.f("ix_usage_days_day"), table_name="usage_days")
    op.drop_table("usage_days")
