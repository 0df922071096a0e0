"""Migration 0021: price plans gain nullable max_n and max_top_logprobs; existing plans keep the defaults."""

from __future__ import annotations

import pytest

from migrations.runner import downgrade, upgrade
from tests.registry.migration_support import *  # the empty_db_url fixture
from tests.registry.migration_support import insert_plan_row, plan_columns, plan_rows

pytestmark = pytest.mark.slow


def test_0021_adds_nullable_max_n_and_max_top_logprobs_keeping_plans_and_downgrades(
    empty_db_url: str,
) -> None:
    upgrade(empty_db_url, "0020")
    insert_plan_row(empty_db_url)
    upgrade(empty_db_url, "0021")
    # NULL: the defaults (api/plan_limits.py)
    assert plan_rows(empty_db_url, "name", "max_n", "max_top_logprobs") == [("old", None, None)]
    downgrade(empty_db_url, "0020")
    assert not {"max_n", "max_top_logprobs"} & plan_columns(empty_db_url)
