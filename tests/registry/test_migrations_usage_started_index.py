"""Migration 0023 (billing's index on usage_records.started_at), up and down, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from tests.registry.migration_support import *  # the empty_db_url fixture
from tests.registry.migration_support import insert_usage_row

pytestmark = pytest.mark.slow  # migrations up and down on a fresh database


def _started_indexes(url: str) -> dict[str, list[str]]:
    engine = make_engine(url)
    try:
        indexes = inspect(engine).get_indexes("usage_records")
        return {ix["name"]: ix["column_names"] for ix in indexes if ix["name"] == "ix_usage_records_started"}
    finally:
        engine.dispose()


def test_0023_adds_the_period_index_keeping_rows_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0022")
    insert_usage_row(empty_db_url, "r1", "ok")
    assert _started_indexes(empty_db_url) == {}
    upgrade(empty_db_url, "0023")
    assert _started_indexes(empty_db_url) == {"ix_usage_records_started": ["started_at"]}
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT request_id FROM usage_records").scalars().all() == ["r1"]
    finally:
        engine.dispose()
    downgrade(empty_db_url, "0022")
    assert _started_indexes(empty_db_url) == {}
    assert current_revision(empty_db_url) == "0022"
