"""DoRA adapters (issue 39 item 1): adapter_versions.use_dora records a version validated as DoRA (peft
use_dora), so routing sends its requests to native workers only (vLLM cannot serve DoRA). Existing rows are
plain LoRA (DoRA uploads were refused before).

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("adapter_versions") as batch:
        batch.add_column(sa.Column("use_dora", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("adapter_versions") as batch:
        batch.drop_column("use_dora")
