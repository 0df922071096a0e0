"""Capacity-plan jobs (issue 33 item 1): POST /v1/admin/plan queues a job in plan_jobs and answers 202; the
job runs out of the request path (a child process in embedded mode, a Celery task otherwise).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 23:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "plan_jobs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("runner", sa.String(length=16), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_plan_jobs_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plan_jobs")),
    )
    op.create_index("ix_plan_jobs_status", "plan_jobs", ["status"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_plan_jobs_status", table_name="plan_jobs")
    op.drop_table("plan_jobs")
