"""Run the packaged Alembic migrations programmatically (used by `lorahost db upgrade` and `serve`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

PACKAGE_DIR = Path(__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    """An Alembic Config for the packaged scripts, pointed at `database_url`."""
    config = Config(str(PACKAGE_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(PACKAGE_DIR))
    # ConfigParser interpolation: a literal % in the URL (e.g. an encoded password) must be doubled.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Upgrade the database at `database_url` to `revision`."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Downgrade the database at `database_url` to `revision`."""
    command.downgrade(alembic_config(database_url), revision)


def current_revision(database_url: str) -> str | None:
    """The revision the database is at (None for an empty database)."""
    from alembic.runtime.migration import MigrationContext

    from registry.db import make_engine

    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
