"""Database, Redis and S3 fixtures shared by tests/registry, tests/api and tests/jobs.

Import the fixtures into a conftest (`from tests.registry.db_fixtures import *`).
- `db_url` is parametrized over SQLite and PostgreSQL; each backend is migrated once per session.
  PostgreSQL tests run in their own database `lorahost_test_<uuid8>`, dropped at the end.
- `db_connection` / `db_session_factory` / `db_session` roll back everything a test did: one connection,
  an outer transaction, and sessions that commit SAVEPOINTs (join_transaction_mode="create_savepoint").
- Unreachable services skip the tests locally and fail them under CI=true.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from registry.db import make_engine
from tests.conftest import is_ci

PG_ADMIN_URL = os.environ.get(
    "LORAHOST_TEST_POSTGRES_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("LORAHOST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

__all__ = [
    "db_connection",
    "db_engine",
    "db_session",
    "db_session_factory",
    "db_url",
    "fresh_db_url",
    "postgres_url",
    "redis_url",
    "s3_bucket",
    "s3_endpoint",
    "sqlite_url",
]


def require_service(reason: str) -> None:
    """Skip locally, fail under CI: service-backed tests must run in CI."""
    if is_ci():
        pytest.fail(f"{reason} (CI=true: service-backed tests must not skip)")
    pytest.skip(reason)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_admin_engine() -> Engine:
    return make_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


def create_postgres_database() -> str:
    """Create a uniquely named database; returns its URL (needs a reachable PostgreSQL)."""
    name = f"lorahost_test_{uuid.uuid4().hex[:8]}"
    admin = _pg_admin_engine()
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(url: str) -> None:
    """Drop a test database (terminating leftover connections)."""
    name = make_url(url).database
    admin = _pg_admin_engine()
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


def postgres_reachable() -> str | None:
    """None when PostgreSQL answers, else the reason it does not."""
    admin = _pg_admin_engine()
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return None
    except Exception as exc:  # noqa: BLE001 - any driver/connection error means "not reachable here"
        return (
            f"PostgreSQL not reachable at {make_url(PG_ADMIN_URL).render_as_string()}: {type(exc).__name__}"
        )
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite file database for the whole session."""
    from migrations.runner import upgrade

    url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'registry.db'}"
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A migrated PostgreSQL database of its own, dropped at the end of the session."""
    with migrated_postgres_database() as url:
        yield url


@contextmanager
def migrated_postgres_database() -> Iterator[str]:
    """A new migrated PostgreSQL database (its URL), dropped on exit; skips (fails under CI) without one."""
    from migrations.runner import upgrade

    reason = postgres_reachable()
    if reason:
        require_service(reason)
    url = create_postgres_database()
    try:
        upgrade(url)
        yield url
    finally:
        drop_postgres_database(url)


# The PostgreSQL half of every two-backend test is in the slow tier (`pytest -m "not slow"` runs SQLite only).
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)]


@pytest.fixture(scope="session", params=BACKENDS)
def db_url(request: pytest.FixtureRequest) -> str:
    """The URL of a migrated database, once per backend."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(params=BACKENDS)
def fresh_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new migrated database for one test whose work really commits (concurrency tests): a SQLite
    file, as embedded mode uses, or a PostgreSQL database of its own, dropped afterwards."""
    from migrations.runner import upgrade

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'fresh.db'}"
        upgrade(url)
        yield url
        return
    with migrated_postgres_database() as url:
        yield url


@pytest.fixture(scope="session")
def db_engine(db_url: str) -> Iterator[Engine]:
    """One engine per backend."""
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def db_connection(db_engine: Engine) -> Iterator[Connection]:
    """A connection inside an outer transaction that is rolled back after the test."""
    connection = db_engine.connect()
    transaction = connection.begin()
    try:
        yield connection
    finally:
        if transaction.is_active:
            transaction.rollback()
        connection.close()


@pytest.fixture
def db_session_factory(db_connection: Connection) -> sessionmaker[Session]:
    """Sessions bound to the test connection; their commits are SAVEPOINT releases."""
    return sessionmaker(bind=db_connection, join_transaction_mode="create_savepoint", expire_on_commit=False)


@pytest.fixture
def db_session(db_session_factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work is rolled back after the test."""
    with db_session_factory() as session:
        yield session


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A reachable Redis URL (skip locally / fail under CI otherwise)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any error means "not reachable here"
        require_service(f"Redis not reachable at {REDIS_URL}: {type(exc).__name__}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """An S3 endpoint: LORAHOST_TEST_S3_ENDPOINT, or a moto server started on a free local port."""
    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(var, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    endpoint = os.environ.get("LORAHOST_TEST_S3_ENDPOINT")
    if endpoint:
        yield endpoint
        return
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        require_service(f"moto[server] is not installed: {exc}")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Iterator[str]:
    """A fresh bucket, emptied and removed after the test."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    bucket = f"lorahost-test-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    try:
        yield bucket
    finally:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=item["Key"])
        client.delete_bucket(Bucket=bucket)


def settings_kwargs(tmp_path: Path) -> dict[str, object]:
    """Defaults for explicit test settings (no environment or .env influence on these fields)."""
    return {"data_dir": tmp_path, "admin_key": "test-admin-key", "redis_url": None, "is_inline_jobs": True}
