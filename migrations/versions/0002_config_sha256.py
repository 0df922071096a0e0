"""adapter_versions.config_sha256: the sha256 of adapter_config.json (workers key caches by both digests).

Nullable: versions validated before this revision have no config digest; workers cache those by version id.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("adapter_versions") as batch_op:
        batch_op.add_column(sa.Column("config_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("adapter_versions") as batch_op:
        batch_op.drop_column("config_sha256")
