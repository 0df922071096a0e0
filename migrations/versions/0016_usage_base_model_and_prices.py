"""Usage rows carry the base model they ran on (usage_records.base_model_name; rows of adapter requests from
before are filled from their adapter's base, base-model requests stay NULL), and a catalog model may have its
own token prices per plan (base_models.prices: plan name or "*" -> per-1M-token prompt and completion prices) and
records its base weights' norms (base_models.weight_norms: adapters' updates are bounded relative to them where the
weights are not local; NULL for models added before, which get the absolute bounds only).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26 11:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("base_model_name", sa.String(length=200), nullable=True))
    op.execute(
        "UPDATE usage_records SET base_model_name = "
        "(SELECT adapters.base_model_name FROM adapters WHERE adapters.id = usage_records.adapter_id) "
        "WHERE adapter_id IS NOT NULL"
    )
    with op.batch_alter_table("base_models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("prices", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("weight_norms", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("base_models", schema=None) as batch_op:
        batch_op.drop_column("weight_norms")
        batch_op.drop_column("prices")
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.drop_column("base_model_name")
