"""Alembic migrations on empty SQLite and PostgreSQL databases, and `lorahost db upgrade`."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from typer.testing import CliRunner

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from registry.models import Base
from tests.registry.migration_support import *  # the empty_db_url fixture
from tests.registry.migration_support import (
    insert_plan_row,
    insert_usage_row,
    plan_columns,
    plan_rows,
    table_names,
)

pytestmark = pytest.mark.slow  # every migration up and down on a fresh database

TABLES = {
    "price_plans",
    "tenants",
    "api_keys",
    "adapters",
    "adapter_versions",
    "usage_records",
    "base_models",
    "console_sessions",
    "base_model_names",
    "plan_jobs",
    "usage_days",
    "rolled_usage_days",
}


def test_upgrade_creates_the_schema_on_an_empty_database(empty_db_url: str) -> None:
    assert current_revision(empty_db_url) is None
    upgrade(empty_db_url)
    assert table_names(empty_db_url) == TABLES
    assert current_revision(empty_db_url) == "0027"


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


def test_0026_adds_use_dora_false_for_existing_versions_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0025")
    assert "use_dora" not in _version_columns(empty_db_url)
    upgrade(empty_db_url, "0026")
    assert _version_columns(empty_db_url)["use_dora"] is False  # not null, false for rows from before 0026
    downgrade(empty_db_url, "0025")
    assert "use_dora" not in _version_columns(empty_db_url)


def test_downgrade_to_base_and_upgrade_again(empty_db_url: str) -> None:
    upgrade(empty_db_url)
    downgrade(empty_db_url, "base")
    assert table_names(empty_db_url) == set()
    upgrade(empty_db_url)
    assert table_names(empty_db_url) == TABLES


def test_cli_db_upgrade_migrates_the_configured_database(tmp_path: Path) -> None:
    from lorahost.cli import app

    url = f"sqlite:///{tmp_path / 'nested' / 'cli.db'}"
    result = CliRunner().invoke(app, ["db", "upgrade", "--database-url", url])
    assert result.exit_code == 0, result.output
    assert table_names(url) == TABLES


def test_0004_allows_in_progress_and_interrupted_rows_and_downgrades(empty_db_url: str) -> None:
    from sqlalchemy.exc import IntegrityError

    upgrade(empty_db_url, "0001")
    with pytest.raises(IntegrityError):
        insert_usage_row(empty_db_url, "r0", "in_progress")
    insert_usage_row(empty_db_url, "r1", "ok")
    upgrade(empty_db_url, "0004")
    insert_usage_row(empty_db_url, "r2", "in_progress")
    insert_usage_row(empty_db_url, "r3", "interrupted")
    with pytest.raises(IntegrityError):
        insert_usage_row(empty_db_url, "r4", "bogus")
    downgrade(empty_db_url, "0001")
    with pytest.raises(IntegrityError):
        insert_usage_row(empty_db_url, "r5", "in_progress")
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            statuses = dict(conn.exec_driver_sql("SELECT request_id, status FROM usage_records").all())
    finally:
        engine.dispose()
    assert statuses == {"r1": "ok", "r2": "aborted", "r3": "aborted"}  # the old CHECK holds again


def _usage_columns(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("usage_records")}
    finally:
        engine.dispose()


def test_0005_adds_the_usage_lease_column_keeping_open_rows_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0004")
    insert_usage_row(empty_db_url, "r1", "in_progress")
    assert "lease_renewed_at" not in _usage_columns(empty_db_url)
    upgrade(empty_db_url, "0005")
    assert "lease_renewed_at" in _usage_columns(empty_db_url)
    insert_usage_row(empty_db_url, "r2", "in_progress")
    downgrade(empty_db_url, "0004")
    assert "lease_renewed_at" not in _usage_columns(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            statuses = dict(conn.exec_driver_sql("SELECT request_id, status FROM usage_records").all())
    finally:
        engine.dispose()
    assert statuses == {"r1": "in_progress", "r2": "in_progress"}


def test_0006_adds_the_predicted_output_tokens_column_keeping_rows_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0005")
    insert_usage_row(empty_db_url, "r1", "ok")
    assert "predicted_output_tokens" not in _usage_columns(empty_db_url)
    upgrade(empty_db_url, "0006")
    assert "predicted_output_tokens" in _usage_columns(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT request_id, predicted_output_tokens FROM usage_records").all()
    finally:
        engine.dispose()
    assert [tuple(r) for r in rows] == [("r1", None)]  # rows from before the upgrade had no prediction
    downgrade(empty_db_url, "0005")
    assert "predicted_output_tokens" not in _usage_columns(empty_db_url)
    assert current_revision(empty_db_url) == "0005"


FEATURE_COLUMNS = {"max_tokens", "is_chat", "has_stop", "prompt_features"}


def test_0007_adds_the_prediction_feature_columns_keeping_rows_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0006")
    insert_usage_row(empty_db_url, "r1", "ok")
    assert not FEATURE_COLUMNS & _usage_columns(empty_db_url)
    upgrade(empty_db_url, "0007")
    assert FEATURE_COLUMNS <= _usage_columns(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO usage_records (id, request_id, tenant_id, model_name, prompt_tokens, completion_tokens, "
                "status, started_at, max_tokens, is_chat, has_stop, prompt_features) VALUES ('r2', 'r2', 't', 'm', 3, "
                "4, 'ok', CURRENT_TIMESTAMP, 16, true, false, '[0.5,0.5]')"
            )
            rows = conn.exec_driver_sql(
                "SELECT request_id, max_tokens, is_chat, has_stop, prompt_features FROM usage_records "
                "ORDER BY request_id"
            ).all()
    finally:
        engine.dispose()
    # rows from before the upgrade recorded no features (the training job skips them)
    assert [tuple(r) for r in rows] == [("r1", None, None, None, None), ("r2", 16, True, False, "[0.5,0.5]")]
    downgrade(empty_db_url, "0006")
    assert not FEATURE_COLUMNS & _usage_columns(empty_db_url)
    assert current_revision(empty_db_url) == "0006"


QUOTA_COLUMNS = {"uploads_per_min", "max_adapters", "max_stored_bytes"}


def test_0011_adds_nullable_upload_quotas_keeping_plans_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0007")
    insert_plan_row(empty_db_url)
    upgrade(empty_db_url, "0011")
    # an existing plan keeps no quota: today's behaviour
    assert plan_rows(empty_db_url, "name", *sorted(QUOTA_COLUMNS)) == [("old", None, None, None)]
    downgrade(empty_db_url, "0007")
    assert not QUOTA_COLUMNS & plan_columns(empty_db_url)


def test_0012_clears_the_stored_prompt_histograms_keeping_the_rest_of_each_row(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0007")
    insert_usage_row(empty_db_url, "r1", "ok")
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE usage_records SET prompt_tokens = 3, max_tokens = 16, is_chat = true, has_stop = false, "
                "prompt_features = '[0.5,0.5]'"
            )
        upgrade(empty_db_url, "0012")
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(
                "SELECT request_id, prompt_tokens, max_tokens, is_chat, has_stop, prompt_features FROM usage_records"
            ).all()
    finally:
        engine.dispose()
    assert [tuple(r) for r in rows] == [("r1", 3, 16, True, False, None)]
    downgrade(empty_db_url, "0007")  # nothing to restore: the histograms are gone for good
    assert current_revision(empty_db_url) == "0007"


def test_0010_adds_the_nullable_concurrency_cap_to_plans_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0007")
    assert "max_concurrent_requests" not in plan_columns(empty_db_url)
    upgrade(empty_db_url, "0010")
    assert "max_concurrent_requests" in plan_columns(empty_db_url)
    downgrade(empty_db_url, "0007")
    assert "max_concurrent_requests" not in plan_columns(empty_db_url)


def test_0013_adds_the_nullable_fair_share_weight_to_plans_keeping_them_and_downgrades(
    empty_db_url: str,
) -> None:
    upgrade(empty_db_url, "0012")
    insert_plan_row(empty_db_url)
    upgrade(empty_db_url, "0013")
    # an existing plan keeps weight 1 (an equal share): today's behaviour
    assert plan_rows(empty_db_url, "name", "fair_share_weight") == [("old", None)]
    downgrade(empty_db_url, "0012")
    assert "fair_share_weight" not in plan_columns(empty_db_url)


def test_0016_names_the_base_model_of_old_adapter_rows_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0015")
    insert_usage_row(empty_db_url, "r-base", "ok")
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO adapters (id, tenant_id, name, visibility, base_model_name, created_at) "
                "VALUES ('a', 't', 'writer', 'private', 'wide', CURRENT_TIMESTAMP)"
            )
            conn.exec_driver_sql(
                "INSERT INTO usage_records (id, request_id, tenant_id, adapter_id, model_name, prompt_tokens, "
                "completion_tokens, status, started_at) VALUES ('r-a', 'r-a', 't', 'a', 'writer', 0, 0, 'ok', "
                "CURRENT_TIMESTAMP)"
            )
        upgrade(empty_db_url, "0016")
        with engine.connect() as conn:
            bases = dict(conn.exec_driver_sql("SELECT request_id, base_model_name FROM usage_records").all())
    finally:
        engine.dispose()
    assert bases == {
        "r-base": None,
        "r-a": "wide",
    }  # an adapter's rows take its base; base requests stay NULL
    downgrade(empty_db_url, "0015")
    assert "base_model_name" not in _usage_columns(empty_db_url)
