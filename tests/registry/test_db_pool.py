"""The PostgreSQL connection pool an API process keeps (settings.storage.database_pool_size): sized so that the
stream ends of a burst reuse connections instead of opening a server process each."""

from __future__ import annotations

import pytest

from registry.db import make_engine
from settings import Settings

PG_URL = "postgresql+psycopg://nobody@127.0.0.1:1/none"  # never connected to: pools connect on first use


def test_the_pool_keeps_the_configured_connections_and_bursts_overflow_beyond() -> None:
    engine = make_engine(PG_URL, pool_size=7)
    assert engine.pool.size() == 7  # type: ignore[attr-defined]
    assert engine.pool._max_overflow == 40  # type: ignore[attr-defined]
    assert make_engine(PG_URL).pool.size() == 5  # type: ignore[attr-defined]  # SQLAlchemy's own default


def test_the_setting_defaults_to_20_and_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().storage.database_pool_size == 20
    monkeypatch.setenv("LORAHOST_DATABASE_POOL_SIZE", "9")
    assert Settings().storage.database_pool_size == 9
    monkeypatch.setenv("LORAHOST_DATABASE_POOL_SIZE", "0")
    with pytest.raises(ValueError, match="database_pool_size"):
        Settings()
