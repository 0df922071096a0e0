"""Usage rows record the predicted output length (`predicted_output_tokens`) next to the true count.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 06:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows written before the upgrade keep NULL: no prediction was made for them.
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("predicted_output_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.drop_column("predicted_output_tokens")
