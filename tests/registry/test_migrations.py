"""Alembic migrations on empty SQLite and PostgreSQL databases, and `lorahost db upgrade`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from typer.testing import CliRunner

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from registry.models import Base
from tests.registry.db_fixtures import (
    create_postgres_database,
    drop_postgres_database,
    postgres_reachable,
    require_service,
)

TABLES = {"price_plans", "tenants", "api_keys", "adapters", "adapter_versions", "usage_records"}


@pytest.fixture(params=["sqlite", "postgres"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A brand-new empty database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    reason = postgres_reachable()
    if reason:
        require_service(reason)
    url = create_postgres_database()
    try:
        yield url
    finally:
        drop_postgres_database(url)


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_creates_the_schema_on_an_empty_database(empty_db_url: str) -> None:
    assert current_revision(empty_db_url) is None
    upgrade(empty_db_url)
    assert _tables(empty_db_url) == TABLES
    assert current_revision(empty_db_url) == "0002"


def test_migrated_schema_matches_the_models(empty_db_url: str) -> None:
    upgrade(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def _version_columns(url: str) -> dict[str, bool]:
    engine = make_engine(url)
    try:
        return {c["name"]: c["nullable"] for c in inspect(engine).get_columns("adapter_versions")}
    finally:
        engine.dispose()


def test_0002_adds_a_nullable_config_sha256_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0001")
    assert "config_sha256" not in _version_columns(empty_db_url)
    upgrade(empty_db_url)
    assert _version_columns(empty_db_url)["config_sha256"] is True  # rows from before 0002 have none
    downgrade(empty_db_url, "0001")
    assert "config_sha256" not in _version_columns(empty_db_url)


def test_downgrade_to_base_and_upgrade_again(empty_db_url: str) -> None:
    upgrade(empty_db_url)
    downgrade(empty_db_url, "base")
    assert _tables(empty_db_url) == set()
    upgrade(empty_db_url)
    assert _tables(empty_db_url) == TABLES


def test_cli_db_upgrade_migrates_the_configured_database(tmp_path: Path) -> None:
    from lorahost.cli import app

    url = f"sqlite:///{tmp_path / 'nested' / 'cli.db'}"
    result = CliRunner().invoke(app, ["db", "upgrade", "--database-url", url])
    assert result.exit_code == 0, result.output
    assert _tables(url) == TABLES
