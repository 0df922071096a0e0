"""Alembic environment: target metadata from registry.models, URL from the caller or from Settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from registry.models import Base

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from settings import Settings

    return Settings().resolved_database_url()


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    dialect = connection.dialect.name if connection is not None else (url or "").split(":")[0]
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        render_as_batch=dialect.startswith("sqlite"),  # SQLite ALTERs go through table copies
        compare_type=True,
        literal_binds=connection is None,
    )


def run_migrations_offline() -> None:
    """Emit SQL to stdout (`alembic upgrade --sql`)."""
    _configure(url=_database_url())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against a live database (a connection passed in attributes, or one made from the URL)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    from registry.db import make_engine

    engine = make_engine(_database_url())
    try:
        with engine.connect() as conn:
            _run_on(conn)
    finally:
        engine.dispose()


def _run_on(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
    if connection.in_transaction():
        connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
