"""Crash-safe metering: usage rows open `in_progress`, close `interrupted`; owner and checkpoint columns.

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-23 06:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_STATUSES = "status IN ('ok', 'error', 'aborted', 'rejected')"
NEW_STATUSES = "status IN ('ok', 'error', 'aborted', 'rejected', 'in_progress', 'interrupted')"
OPEN_ROWS = sa.text("status = 'in_progress'")


def upgrade() -> None:
    # batch: SQLite cannot alter a CHECK constraint in place (the table is copied); PostgreSQL alters it.
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("api_instance_id", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("checkpointed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.drop_constraint(batch_op.f("ck_usage_records_status"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_usage_records_status"), sa.text(NEW_STATUSES))
    op.create_index(
        "ix_usage_records_open_owner",
        "usage_records",
        ["api_instance_id"],
        unique=False,
        postgresql_where=OPEN_ROWS,
        sqlite_where=OPEN_ROWS,
    )


def downgrade() -> None:
    # Rows still open (or closed by a crash) get the nearest old status: the client did not get a full answer.
    op.execute("UPDATE usage_records SET status = 'aborted' WHERE status IN ('in_progress', 'interrupted')")
    op.drop_index(
        "ix_usage_records_open_owner",
        table_name="usage_records",
        postgresql_where=OPEN_ROWS,
        sqlite_where=OPEN_ROWS,
    )
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_usage_records_status"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_usage_records_status"), sa.text(OLD_STATUSES))
        batch_op.drop_column("checkpointed_at")
        batch_op.drop_column("api_instance_id")
