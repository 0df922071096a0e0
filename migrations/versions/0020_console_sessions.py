"""Server-side console sessions (issue 33, item 7): console_sessions holds a SHA-256 of each signed-in
session's id, who it is (role; a tenant's id and the key it signed in with), when it was created, expires and
was revoked (sign-out). Every console request checks its row, so a signed-out cookie no longer works.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 23:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("session_id_hash", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=True),
        sa.Column("api_key_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("role IN ('tenant', 'operator')", name=op.f("ck_console_sessions_role")),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_console_sessions_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name=op.f("fk_console_sessions_api_key_id_api_keys"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id_hash", name=op.f("pk_console_sessions")),
    )
    op.create_index(op.f("ix_console_sessions_tenant_id"), "console_sessions", ["tenant_id"])
    op.create_index(op.f("ix_console_sessions_api_key_id"), "console_sessions", ["api_key_id"])
    op.create_index(op.f("ix_console_sessions_expires_at"), "console_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_console_sessions_expires_at"), table_name="console_sessions")
    op.drop_index(op.f("ix_console_sessions_api_key_id"), table_name="console_sessions")
    op.drop_index(op.f("ix_console_sessions_tenant_id"), table_name="console_sessions")
    op.drop_table("console_sessions")
