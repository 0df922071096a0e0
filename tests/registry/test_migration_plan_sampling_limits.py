"""Migration 0021: price plans gain nullable max_n and max_top_logprobs; existing plans keep the defaults."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from migrations.runner import downgrade, upgrade
from registry.db import make_engine
from tests.registry.migration_support import *  # the empty_db_url fixture

pytestmark = pytest.mark.slow


def _plan_columns(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("price_plans")}
    finally:
        engine.dispose()


def test_0021_adds_nullable_max_n_and_max_top_logprobs_keeping_plans_and_downgrades(
    empty_db_url: str,
) -> None:
    upgrade(empty_db_url, "0020")
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO price_plans (id, name, price_per_1m_prompt_tokens, price_per_1m_completion_tokens, "
                "price_storage_per_adapter_day, slo_percentile, created_at) VALUES ('p1', 'old', 0, 0, 0, 99, "
                "CURRENT_TIMESTAMP)"
            )
        upgrade(empty_db_url, "0021")
        with engine.begin() as conn:
            row = conn.exec_driver_sql("SELECT name, max_n, max_top_logprobs FROM price_plans").one()
    finally:
        engine.dispose()
    assert tuple(row) == ("old", None, None)  # NULL: the defaults (api/plan_limits.py)
    downgrade(empty_db_url, "0020")
    assert not {"max_n", "max_top_logprobs"} & _plan_columns(empty_db_url)
