"""Migration 0019 (base_model_names): every catalog model's name and valid aliases reserved, live models first;
existing aliases that break the rule or repeat another name are dropped (the migration never fails on them);
down drops the table."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import inspect

from migrations.runner import current_revision, downgrade, upgrade
from registry.db import make_engine
from tests.registry.migration_support import *  # the empty_db_url fixture

pytestmark = pytest.mark.slow  # migrations up and down on a fresh database

MODELS = [  # id, name, aliases, status, created_at
    ("m-old", "tiny", ["org/tiny", "old-only"], "removed", "2026-01-01 00:00:00"),
    (
        "m-new",
        "tiny",
        ["org/Tiny", "../../etc", "<img src=x>", "tiny", "ORG/TINY"],
        "ready",
        "2026-02-01 00:00:00",
    ),
    ("m-gone", "gone", ["tiny", "bad\n", "org/gone"], "removed", "2026-01-15 00:00:00"),
    ("m-evil", "evil\n", [], "removed", "2026-01-20 00:00:00"),
]


def _insert_models(url: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for model_id, name, aliases, status, created_at in MODELS:
                conn.exec_driver_sql(
                    "INSERT INTO base_models (id, name, model_type, shape, dtype, files, num_bytes, engines, "
                    "aliases, status, created_at) VALUES (%s, %s, 'llama', '{}', 'float32', '[]', 0, "
                    "'[\"native\"]', %s, %s, %s)".replace("%s", "?" if url.startswith("sqlite") else "%s"),
                    (model_id, name, json.dumps(aliases), status, created_at),
                )
    finally:
        engine.dispose()


def _read(url: str) -> tuple[dict[str, tuple[str, bool]], dict[str, list[str]]]:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            names = conn.exec_driver_sql("SELECT name, model_id, is_alias FROM base_model_names").all()
            aliases = conn.exec_driver_sql("SELECT id, aliases FROM base_models").all()
    finally:
        engine.dispose()
    decoded = {i: json.loads(a) if isinstance(a, str) else a for i, a in aliases}
    return {n: (m, bool(a)) for n, m, a in names}, decoded


def test_0019_reserves_names_and_valid_aliases_and_downgrades(empty_db_url: str) -> None:
    upgrade(empty_db_url, "0018")
    _insert_models(empty_db_url)
    upgrade(empty_db_url, "0019")
    names, aliases = _read(empty_db_url)
    assert names == {
        "tiny": ("m-new", False),  # the live holder of a shared name
        "gone": ("m-gone", False),
        "evil\n": ("m-evil", False),  # an old bad name stays reserved as it is: no adapter can take it
        "org/tiny": ("m-new", True),
        "old-only": ("m-old", True),
        "org/gone": ("m-gone", True),
    }
    assert aliases == {
        "m-new": ["org/Tiny"],
        "m-old": ["old-only"],  # org/tiny went to the live model
        "m-gone": ["org/gone"],  # 'tiny' is a name, 'bad\n' breaks the rule
        "m-evil": [],
    }
    downgrade(empty_db_url, "0018")
    engine = make_engine(empty_db_url)
    try:
        assert "base_model_names" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
    assert current_revision(empty_db_url) == "0018"
