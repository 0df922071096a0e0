"""Tenants get a nullable prefix_cache_namespace: the shared prefix-cache namespace an operator put the tenant
in (NULL: the tenant's own namespace, isolated from every other tenant's cached KV blocks).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing tenants keep NULL: each gets its own namespace (nothing is shared unless an operator says so).
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("prefix_cache_namespace", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("prefix_cache_namespace")
