"""An index on usage_records.started_at for billing's period scans (issue 38 item 3): billing sums every tenant's
usage rows of a period in the database (registry/billing.py usage_totals), and ix_usage_records_tenant_started
cannot serve a time range across all tenants, so a month's bill scanned the whole table (1.6 s at 20 M rows).
(A big registry: create it CONCURRENTLY by hand first, this then finds it.)

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 21:15:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_usage_records_started", "usage_records", ["started_at"], if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_usage_records_started", table_name="usage_records")
