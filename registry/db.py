"""Engine and session factories. Nothing connects until a session is used."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(database_url: str, **kwargs: Any) -> Engine:
    """An Engine for `database_url` (PostgreSQL via psycopg, or SQLite).

    SQLite gets real transactions (explicit BEGIN, so SAVEPOINTs work), foreign keys, WAL for files
    and a busy timeout, so the API and an inline or Celery job can share one file safely.
    """
    if database_url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {"check_same_thread": False, "timeout": 30})
        engine = create_engine(database_url, **kwargs)
        _configure_sqlite(engine, is_file=":memory:" not in database_url and database_url != "sqlite://")
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(database_url, **kwargs)


def _configure_sqlite(engine: Engine, is_file: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let SQLAlchemy emit BEGIN itself
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        if is_file:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit (the API returns them)."""
    return sessionmaker(bind=engine, expire_on_commit=False)
