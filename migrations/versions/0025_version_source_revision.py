"""The commit a Hugging Face Hub import read (issue 39 item 3): adapter_versions.source_revision, the 40-hex
commit an `hf://org/name[@revision]` import resolved its revision to and downloaded (null for uploads and for
https:// and s3:// imports, and for every version before this revision).

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-29 11:55:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("adapter_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("source_revision", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("adapter_versions", schema=None) as batch_op:
        batch_op.drop_column("source_revision")
