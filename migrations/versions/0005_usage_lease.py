"""Usage-row leases: `lease_renewed_at`, renewed by the owning API process while a row is open.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 06:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows open during the upgrade keep a NULL lease: the sweep falls back to their last checkpoint or start.
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_renewed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.drop_column("lease_renewed_at")
