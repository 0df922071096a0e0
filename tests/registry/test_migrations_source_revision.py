"""Migration 0025 (adapter_versions.source_revision, the commit a Hub import read), up and down, on SQLite and
PostgreSQL: existing versions keep their rows with no revision, and the column goes again on the way down."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from tests.registry.migration_support import *  # the empty_db_url fixture

pytestmark = pytest.mark.slow  # migrations up and down on a fresh database

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _version_columns(url: str) -> dict[str, bool]:
    engine = make_engine(url)
    try:
        return {c["name"]: c["nullable"] for c in inspect(engine).get_columns("adapter_versions")}
    finally:
        engine.dispose()


def _insert_version(url: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO tenants (id, name, is_active, created_at) VALUES ('t', 't', true, CURRENT_TIMESTAMP)"
            )
            conn.exec_driver_sql(
                "INSERT INTO adapters (id, tenant_id, name, visibility, base_model_name, created_at) VALUES "
                "('a', 't', 'lora', 'private', 'base', CURRENT_TIMESTAMP)"
            )
            conn.exec_driver_sql(
                "INSERT INTO adapter_versions (id, adapter_id, number, status, source_uri, created_at) VALUES "
                "('v1', 'a', 1, 'ready', 's3://bucket/lora', CURRENT_TIMESTAMP)"
            )
    finally:
        engine.dispose()


def _rows(url: str, sql: str) -> list[tuple]:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            result = conn.exec_driver_sql(sql)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def test_0025_adds_a_nullable_source_revision_keeping_versions_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0024")
    _insert_version(empty_db_url)
    assert "source_revision" not in _version_columns(empty_db_url)
    upgrade(empty_db_url, "0025")
    assert _version_columns(empty_db_url)["source_revision"] is True
    assert _rows(empty_db_url, "SELECT id, source_uri, source_revision FROM adapter_versions") == [
        ("v1", "s3://bucket/lora", None)
    ]
    _rows(empty_db_url, f"UPDATE adapter_versions SET source_revision = '{COMMIT}'")
    assert _rows(empty_db_url, "SELECT source_revision FROM adapter_versions") == [(COMMIT,)]
    downgrade(empty_db_url, "0024")
    assert "source_revision" not in _version_columns(empty_db_url)
    assert _rows(empty_db_url, "SELECT id FROM adapter_versions") == [("v1",)]
    assert current_revision(empty_db_url) == "0024"
