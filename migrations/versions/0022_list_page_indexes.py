"""Indexes for the keyset pagination of the list endpoints (issue 38, item 3): tenants by (created_at, id), a
tenant's API keys by (created_at, id), public live adapters by (name, created_at, id), and an adapter's ready
versions by number. The other lists page on indexes that exist already: a tenant's live adapters on
uq_adapters_tenant_name_live, an adapter's versions on uq_adapter_versions_adapter_number, a tenant's usage on
ix_usage_records_tenant_started. (A big registry: create them CONCURRENTLY by hand first, this then finds them.)

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28 12:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PUBLIC_LIVE_ADAPTER = "visibility = 'public' AND deleted_at IS NULL"
READY_VERSION = "status = 'ready'"


def upgrade() -> None:
    op.create_index("ix_tenants_created_at_id", "tenants", ["created_at", "id"], if_not_exists=True)
    op.create_index(
        "ix_api_keys_tenant_created", "api_keys", ["tenant_id", "created_at", "id"], if_not_exists=True
    )
    op.create_index(
        "ix_adapters_public_name",
        "adapters",
        ["name", "created_at", "id"],
        postgresql_where=sa.text(PUBLIC_LIVE_ADAPTER),
        sqlite_where=sa.text(PUBLIC_LIVE_ADAPTER),
        if_not_exists=True,
    )
    op.create_index(
        "ix_adapter_versions_ready",
        "adapter_versions",
        ["adapter_id", "number"],
        postgresql_where=sa.text(READY_VERSION),
        sqlite_where=sa.text(READY_VERSION),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_adapter_versions_ready", table_name="adapter_versions")
    op.drop_index("ix_adapters_public_name", table_name="adapters")
    op.drop_index("ix_api_keys_tenant_created", table_name="api_keys")
    op.drop_index("ix_tenants_created_at_id", table_name="tenants")
