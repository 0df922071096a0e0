"""Migration 0018: the plan_jobs table (capacity-plan jobs, issue 33 item 1), up and down."""

from __future__ import annotations

import pytest

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from tests.registry.migration_support import *  # the empty_db_url fixture
from tests.registry.migration_support import table_names

pytestmark = pytest.mark.slow  # migrations up and down on a fresh database


def test_0018_creates_plan_jobs_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0017")
    assert "plan_jobs" not in table_names(empty_db_url)
    upgrade(empty_db_url, "0018")
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO plan_jobs (id, status, inputs, runner, created_at, deadline_at) VALUES "
                "('j', 'queued', '{}', 'embedded', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
            with pytest.raises(Exception, match="(?i)check"), conn.begin_nested():  # statuses are checked
                conn.exec_driver_sql(
                    "INSERT INTO plan_jobs (id, status, inputs, runner, created_at, deadline_at) VALUES "
                    "('k', 'paused', '{}', 'embedded', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
    finally:
        engine.dispose()
    downgrade(empty_db_url, "0017")
    assert "plan_jobs" not in table_names(empty_db_url)
    assert current_revision(empty_db_url) == "0017"
