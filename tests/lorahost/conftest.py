"""lorahost CLI and server test fixtures: databases (SQLite + PostgreSQL; see tests/registry/db_fixtures.py)."""

from tests.registry.db_fixtures import *
