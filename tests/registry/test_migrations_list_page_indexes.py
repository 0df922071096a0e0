"""Migration 0022 (the list pages' indexes), up and down, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from tests.registry.migration_support import *  # the empty_db_url fixture
from tests.registry.migration_support import insert_usage_row

pytestmark = pytest.mark.slow  # migrations up and down on a fresh database

NEW_INDEXES = {
    "tenants": {"ix_tenants_created_at_id": ["created_at", "id"]},
    "api_keys": {"ix_api_keys_tenant_created": ["tenant_id", "created_at", "id"]},
    "adapters": {"ix_adapters_public_name": ["name", "created_at", "id"]},
    "adapter_versions": {"ix_adapter_versions_ready": ["adapter_id", "number"]},
}


def _indexes(url: str) -> dict[str, dict[str, list[str]]]:
    engine = make_engine(url)
    try:
        inspector = inspect(engine)
        return {
            table: {
                ix["name"]: ix["column_names"] for ix in inspector.get_indexes(table) if ix["name"] in wanted
            }
            for table, wanted in NEW_INDEXES.items()
        }
    finally:
        engine.dispose()


def test_0022_adds_the_list_page_indexes_keeping_rows_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0021")
    insert_usage_row(empty_db_url, "r1", "ok")  # creates tenant 't'
    assert _indexes(empty_db_url) == {table: {} for table in NEW_INDEXES}
    upgrade(empty_db_url, "0022")
    assert _indexes(empty_db_url) == NEW_INDEXES
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT name FROM tenants").scalars().all() == ["t"]
    finally:
        engine.dispose()
    downgrade(empty_db_url, "0021")
    assert _indexes(empty_db_url) == {table: {} for table in NEW_INDEXES}
    assert current_revision(empty_db_url) == "0021"
