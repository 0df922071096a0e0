"""Usage rows record what the output-length predictor knew at admission (its training data): max_tokens,
is_chat, has_stop and the prompt's hashed n-gram features (a JSON list of floats, never the prompt).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 06:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FEATURE_COLUMNS = ("max_tokens", "is_chat", "has_stop", "prompt_features")


def upgrade() -> None:
    # Rows written before the upgrade keep NULL: the training job skips them (no features were recorded).
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_tokens", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("is_chat", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("has_stop", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("prompt_features", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        for name in reversed(FEATURE_COLUMNS):
            batch_op.drop_column(name)
