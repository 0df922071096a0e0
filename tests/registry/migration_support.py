"""Migration test fixtures: a brand-new empty database on each backend; a usage row (the schema of any
revision since 0004) and a price plan (any revision) written in raw SQL; the price plans' columns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect

from registry.db import make_engine
from tests.registry.db_fixtures import (
    create_postgres_database,
    drop_postgres_database,
    postgres_reachable,
    require_service,
)

__all__ = ["empty_db_url", "insert_plan_row", "insert_usage_row", "plan_columns", "plan_rows", "table_names"]


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


def insert_usage_row(url: str, request_id: str, status: str) -> None:
    """One usage row of tenant 't' (created if missing) with this request id and status."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO tenants (id, name, is_active, created_at) VALUES ('t', 't', true, "
                "CURRENT_TIMESTAMP) ON CONFLICT DO NOTHING"
            )
            conn.exec_driver_sql(
                "INSERT INTO usage_records (id, request_id, tenant_id, model_name, prompt_tokens, completion_tokens, "
                f"status, started_at) VALUES ('{request_id}', '{request_id}', 't', 'm', 0, 0, '{status}', "
                "CURRENT_TIMESTAMP)"
            )
    finally:
        engine.dispose()


def insert_plan_row(url: str) -> None:
    """One price plan 'p1' named 'old' with only the columns of the first revision set."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO price_plans (id, name, price_per_1m_prompt_tokens, price_per_1m_completion_tokens, "
                "price_storage_per_adapter_day, slo_percentile, created_at) VALUES ('p1', 'old', 0, 0, 0, 99, "
                "CURRENT_TIMESTAMP)"
            )
    finally:
        engine.dispose()


def plan_columns(url: str) -> set[str]:
    """The columns of the price_plans table of the database at `url`."""
    engine = make_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("price_plans")}
    finally:
        engine.dispose()


def plan_rows(url: str, *columns: str) -> list[tuple]:
    """Every price plan's values of `columns` (trusted test names), in no particular order."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(f"SELECT {', '.join(columns)} FROM price_plans")]
    finally:
        engine.dispose()


def table_names(url: str) -> set[str]:
    """The tables of the database at `url`, Alembic's own version table left out."""
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()
