"""Price plans may cap a tenant's concurrent requests (max_concurrent_requests; NULL: no cap).

Revision ID: 0010
Revises: 0007
Create Date: 2026-11-28 18:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing plans keep NULL: no cap, as before.
    with op.batch_alter_table("price_plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_concurrent_requests", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("price_plans", schema=None) as batch_op:
        batch_op.drop_column("max_concurrent_requests")
