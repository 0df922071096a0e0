"""Reserved base-model names (issue 33 items 5 and 6): table base_model_names, one row per name and alias of every
catalog model (removed ones included), the case-folded name its primary key (registry/model_names.py).

Backfill: live models first (newest first), then removed ones, so a name several rows share (a removed model
added again) is held by its newest live holder. An existing alias that breaks the name rule (`../../etc`,
markup, whitespace) or is already another model's name or alias is not reserved and is dropped from its model's
`aliases` (logged: the operator adds a valid alias again with the CLI); the migration never fails on one. A
model name that breaks today's rule (the old check accepted a trailing newline) is still reserved as it is, so
no adapter can take it. Downgrade drops the table (dropped aliases are not restored).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27 23:40:00.000000
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("alembic.runtime.migration")
# registry/model_names.py's ALIAS_RE, frozen here (a migration never imports code that may change later)
_SEGMENT = r"[A-Za-z0-9](?:[-A-Za-z0-9._]{0,94}[A-Za-z0-9])?"
ALIAS_RE = re.compile(rf"(?:{_SEGMENT}/)?{_SEGMENT}")


def upgrade() -> None:
    op.create_table(
        "base_model_names",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("model_id", sa.String(length=36), nullable=False),
        sa.Column("is_alias", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["base_models.id"],
            name=op.f("fk_base_model_names_model_id_base_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_base_model_names")),
    )
    op.create_index(op.f("ix_base_model_names_model_id"), "base_model_names", ["model_id"], unique=False)
    _backfill(op.get_bind())


def _aliases(value: Any) -> list[Any]:
    if isinstance(value, str):  # JSON read back as text by some drivers
        value = json.loads(value)
    return list(value) if isinstance(value, list) else []


def _backfill(conn: sa.Connection) -> None:
    rows = conn.execute(
        sa.text(
            "SELECT id, name, aliases FROM base_models "
            "ORDER BY CASE WHEN status = 'ready' THEN 0 ELSE 1 END, created_at DESC, id"
        )
    ).all()
    taken: set[str] = set()
    names = sa.table(
        "base_model_names", sa.column("name"), sa.column("model_id"), sa.column("is_alias", sa.Boolean)
    )
    for model_id, name, _ in rows:  # every model's own name first: an alias never pushes out a name
        if name.lower() not in taken:
            taken.add(name.lower())
            conn.execute(names.insert().values(name=name.lower(), model_id=model_id, is_alias=False))
    for model_id, name, aliases in rows:
        kept = []
        for alias in _aliases(aliases):
            folded = alias.lower() if isinstance(alias, str) else None
            if folded is None or not ALIAS_RE.fullmatch(alias) or ".." in alias or folded in taken:
                if folded != name.lower():
                    log.warning("base model %r: alias %r dropped (invalid or taken)", name, alias)
                continue
            taken.add(folded)
            kept.append(alias)
            conn.execute(names.insert().values(name=folded, model_id=model_id, is_alias=True))
        if kept != _aliases(aliases):
            conn.execute(
                sa.text("UPDATE base_models SET aliases = :aliases WHERE id = :id").bindparams(
                    sa.bindparam("aliases", type_=sa.JSON())
                ),
                {"aliases": kept, "id": model_id},
            )


def downgrade() -> None:
    op.drop_index(op.f("ix_base_model_names_model_id"), table_name="base_model_names")
    op.drop_table("base_model_names")
