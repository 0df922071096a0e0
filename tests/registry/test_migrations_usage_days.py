"""Migration 0024 (the daily usage rollup's tables), up and down, on SQLite and PostgreSQL: usage rows are kept,
the new tables start empty (the usage sweep fills them), and the tables go again on the way down."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from tests.registry.migration_support import *  # the empty_db_url fixture
from tests.registry.migration_support import insert_usage_row

pytestmark = pytest.mark.slow  # migrations up and down on a fresh database

ROLLUP_TABLES = {"usage_days", "rolled_usage_days"}


def _rollup_tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return ROLLUP_TABLES & set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_0024_adds_the_rollup_tables_keeping_usage_rows_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0023")
    insert_usage_row(empty_db_url, "r1", "ok")
    assert _rollup_tables(empty_db_url) == set()
    upgrade(empty_db_url, "0024")
    assert _rollup_tables(empty_db_url) == ROLLUP_TABLES
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT request_id FROM usage_records").scalars().all() == ["r1"]
            assert conn.exec_driver_sql("SELECT count(*) FROM usage_days").scalar() == 0
            assert inspect(conn).get_pk_constraint("usage_days")["constrained_columns"] == [
                "tenant_id", "day", "model_name", "base_model_name", "status"
            ]  # fmt: skip
    finally:
        engine.dispose()
    downgrade(empty_db_url, "0023")
    assert _rollup_tables(empty_db_url) == set()
    assert current_revision(empty_db_url) == "0023"
