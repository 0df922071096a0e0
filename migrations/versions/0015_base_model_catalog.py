"""The base-model catalog: base_models (name, shape, dtype, files with digests in the blob store, engines,
aliases, status). One live row per name (a partial unique index); removed rows stay for usage history.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 08:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "base_models",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("model_type", sa.String(length=32), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("num_bytes", sa.BigInteger(), nullable=False),
        sa.Column("engines", sa.JSON(), nullable=False),
        sa.Column("aliases", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('ready', 'removed')", name=op.f("ck_base_models_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_base_models")),
    )
    op.create_index(
        "uq_base_models_name_live",
        "base_models",
        ["name"],
        unique=True,
        postgresql_where=sa.text("status = 'ready'"),
        sqlite_where=sa.text("status = 'ready'"),
    )


def downgrade() -> None:
    op.drop_index("uq_base_models_name_live", table_name="base_models")
    op.drop_table("base_models")
