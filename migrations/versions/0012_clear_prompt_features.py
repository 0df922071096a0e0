"""Clear the stored prompt n-gram histograms: `usage_records.prompt_features` held 16 hashed word
n-gram frequencies of each prompt, which gave its exact word count and narrowed down what it said (10,000
candidate PINs to 1,124). The API no longer writes the column and the length predictor's training no longer
reads it; this sets it to NULL on every row. The column stays (always NULL) so an API replica of the previous
release can still insert during a rolling upgrade; rows such a replica writes meanwhile are cleared by running
this migration's UPDATE again once the rollout is done (the README says so next to what is stored per request).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("UPDATE usage_records SET prompt_features = NULL WHERE prompt_features IS NOT NULL")


def downgrade() -> None:
    # The histograms are gone for good (that is the point); the previous release reads NULL as "no features".
    pass
