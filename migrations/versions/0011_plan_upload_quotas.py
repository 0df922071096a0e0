"""Price plans get upload quotas: uploads per minute, live adapters, stored bytes (NULL = unlimited).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 06:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing plans keep NULL: no quota, today's behaviour.
    with op.batch_alter_table("price_plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("uploads_per_min", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_adapters", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_stored_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("price_plans", schema=None) as batch_op:
        batch_op.drop_column("max_stored_bytes")
        batch_op.drop_column("max_adapters")
        batch_op.drop_column("uploads_per_min")
