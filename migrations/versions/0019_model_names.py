"""Placeholder for reserved base-model names (issue 33); filled in by its change.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27 23:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
