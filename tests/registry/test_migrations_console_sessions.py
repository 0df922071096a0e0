"""Migration 0020 (console_sessions), up and down, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from tests.registry.migration_support import *  # the empty_db_url fixture
from tests.registry.migration_support import insert_usage_row, table_names

pytestmark = pytest.mark.slow  # migrations up and down on a fresh database


def test_0020_creates_console_sessions_keyed_by_hash_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0019")
    insert_usage_row(empty_db_url, "r1", "ok")  # creates tenant 't'
    assert "console_sessions" not in table_names(empty_db_url)
    upgrade(empty_db_url, "0020")
    engine = make_engine(empty_db_url)
    try:
        columns = {c["name"] for c in inspect(engine).get_columns("console_sessions")}
        assert columns == {
            "session_id_hash",
            "role",
            "tenant_id",
            "api_key_id",
            "created_at",
            "expires_at",
            "revoked_at",
        }
        assert inspect(engine).get_pk_constraint("console_sessions")["constrained_columns"] == [
            "session_id_hash"
        ]
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO console_sessions (session_id_hash, role, tenant_id, created_at, expires_at) VALUES "
                "('h1', 'tenant', 't', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP), "
                "('h2', 'operator', NULL, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
            assert conn.exec_driver_sql("SELECT count(*) FROM console_sessions").scalar() == 2
    finally:
        engine.dispose()
    downgrade(empty_db_url, "0019")
    assert "console_sessions" not in table_names(empty_db_url)
    assert current_revision(empty_db_url) == "0019"
    assert "tenants" in table_names(empty_db_url)
