"""Migrations of the tenants table: 0014 (prefix_cache_namespace) and 0017 (can_manage_keys), up and down,
with existing rows keeping what they had."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from tests.registry.migration_support import *  # the empty_db_url fixture
from tests.registry.migration_support import insert_usage_row

pytestmark = pytest.mark.slow  # migrations up and down on a fresh database


def _tenant_rows(url: str) -> list[tuple]:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            rows = conn.exec_driver_sql("SELECT id, prefix_cache_namespace FROM tenants ORDER BY id").all()
        return [tuple(r) for r in rows]
    finally:
        engine.dispose()


def _tenant_columns(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("tenants")}
    finally:
        engine.dispose()


def test_0014_adds_the_tenant_prefix_cache_namespace_null_for_existing_tenants_and_downgrades(
    empty_db_url: str,
) -> None:
    upgrade(empty_db_url, "0013")
    insert_usage_row(empty_db_url, "r1", "ok")  # creates tenant 't'
    assert "prefix_cache_namespace" not in _tenant_columns(empty_db_url)
    upgrade(empty_db_url, "0014")
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO tenants (id, name, is_active, created_at, prefix_cache_namespace) VALUES "
                "('u', 'u', true, CURRENT_TIMESTAMP, 'team')"
            )
    finally:
        engine.dispose()
    # existing tenants keep their own namespace (NULL): nothing becomes shared by the upgrade
    assert _tenant_rows(empty_db_url) == [("t", None), ("u", "team")]
    downgrade(empty_db_url, "0013")
    assert "prefix_cache_namespace" not in _tenant_columns(empty_db_url)
    assert current_revision(empty_db_url) == "0013"


def test_0017_adds_can_manage_keys_false_for_existing_tenants_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0016")
    insert_usage_row(empty_db_url, "r1", "ok")  # creates tenant 't'
    upgrade(empty_db_url, "0017")
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            flags = conn.exec_driver_sql("SELECT id, can_manage_keys FROM tenants").all()
    finally:
        engine.dispose()
    assert [(tenant_id, bool(flag)) for tenant_id, flag in flags] == [
        ("t", False)
    ]  # only the operator, as before
    downgrade(empty_db_url, "0016")
    assert "can_manage_keys" not in _tenant_columns(empty_db_url)
    assert current_revision(empty_db_url) == "0016"
