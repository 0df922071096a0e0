"""Migration 0027 (usage_records' pages keep room for their rows' checkpoints), up and down, on SQLite and
PostgreSQL, and the same table created from the models."""

from __future__ import annotations

import pytest

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from registry.models import USAGE_FILLFACTOR, Base
from tests.registry.migration_support import *  # the empty_db_url fixture
from tests.registry.migration_support import insert_usage_row

pytestmark = pytest.mark.slow  # migrations up and down on a fresh database


def _fillfactor(url: str) -> int | None:
    """usage_records' fillfactor on PostgreSQL (None: the default, 100); None on SQLite, which has none."""
    engine = make_engine(url)
    try:
        if engine.dialect.name != "postgresql":
            return None
        with engine.connect() as conn:
            options = conn.exec_driver_sql(
                "SELECT reloptions FROM pg_class WHERE relname = 'usage_records'"
            ).scalar_one()
        for option in options or []:
            name, _, value = option.partition("=")
            if name == "fillfactor":
                return int(value)
        return None
    finally:
        engine.dispose()


def test_0027_leaves_room_in_usage_pages_keeping_rows_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0026")
    insert_usage_row(empty_db_url, "r1", "ok")
    assert _fillfactor(empty_db_url) is None
    upgrade(empty_db_url, "0027")
    is_postgresql = empty_db_url.startswith("postgresql")
    assert _fillfactor(empty_db_url) == (USAGE_FILLFACTOR if is_postgresql else None)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT request_id FROM usage_records").scalars().all() == ["r1"]
    finally:
        engine.dispose()
    downgrade(empty_db_url, "0026")
    assert _fillfactor(empty_db_url) is None
    assert current_revision(empty_db_url) == "0026"


def test_the_models_create_usage_records_with_the_migrations_fillfactor(empty_db_url: str) -> None:
    engine = make_engine(empty_db_url)
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()
    is_postgresql = empty_db_url.startswith("postgresql")
    assert _fillfactor(empty_db_url) == (USAGE_FILLFACTOR if is_postgresql else None)
