"""Price plans may weight a tenant's fair share of each engine (fair_share_weight; NULL: weight 1).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing plans keep NULL: weight 1, every tenant an equal share, as before.
    with op.batch_alter_table("price_plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fair_share_weight", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("price_plans", schema=None) as batch_op:
        batch_op.drop_column("fair_share_weight")
