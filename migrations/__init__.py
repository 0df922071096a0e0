"""Alembic migrations for the registry schema (packaged, so `lorahost db upgrade` works when installed)."""
