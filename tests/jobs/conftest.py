"""Job test fixtures: databases (SQLite + PostgreSQL), Redis, S3 (see db_fixtures.py)."""

from tests.registry.db_fixtures import *
