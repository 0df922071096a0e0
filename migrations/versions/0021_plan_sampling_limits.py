"""Price plans may cap one request's n and top_logprobs (max_n, max_top_logprobs; NULL: 8 and 20).

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing plans keep NULL: the defaults of api/plan_limits.py (n up to 8, top_logprobs up to 20).
    with op.batch_alter_table("price_plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_n", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_top_logprobs", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("price_plans", schema=None) as batch_op:
        batch_op.drop_column("max_top_logprobs")
        batch_op.drop_column("max_n")
