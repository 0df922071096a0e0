"""Engine and session factories, and write transactions that are safe under concurrent writers.

Nothing connects until a session is used.

SQLite (embedded mode) allows one writer at a time. A deferred transaction (`BEGIN`) that has read and then
writes must upgrade its lock, and when another connection is writing SQLite refuses that at once with
"database is locked" — the busy timeout does not apply, since waiting could deadlock. Every transaction
that reads then writes therefore starts with `begin_write` (SQLite: `BEGIN IMMEDIATE`, which takes the
write lock up front and waits up to the busy timeout for it) or runs through `run_in_write_transaction`,
which also retries transient failures. Keep those transactions short: no file or network I/O inside.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 30_000
WRITE_TRANSACTION_OPTION = "lorahost_write_transaction"
MAX_WRITE_ATTEMPTS = 5
RETRY_BASE_DELAY_S = 0.01
# PostgreSQL SQLSTATEs a retried transaction can succeed after: serialization failure, deadlock, lock timeout.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
SQLITE_TRANSIENT_MESSAGES = ("database is locked", "database is busy", "database table is locked")


def make_engine(database_url: str, pool_size: int | None = None, **kwargs: Any) -> Engine:
    """An Engine for `database_url` (PostgreSQL via psycopg, or SQLite); `pool_size`: the PostgreSQL connections
    kept open for reuse (settings.storage.database_pool_size; SQLAlchemy's 5 when None).

    SQLite gets real transactions (explicit BEGIN, so SAVEPOINTs work; BEGIN IMMEDIATE for write
    transactions), foreign keys, WAL for files and a busy timeout, so the API threads and an inline or
    Celery job can share one file safely.
    """
    if database_url.startswith("sqlite"):
        kwargs.setdefault(
            "connect_args", {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        )
        engine = create_engine(database_url, **kwargs)
        _configure_sqlite(engine, is_file=":memory:" not in database_url and database_url != "sqlite://")
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    # An API process runs sync work on up to 40 threadpool threads, and an upload with an inline validation
    # job can use two sessions at once: the default 10 overflow connections queue them under a burst.
    # Overflow connections close when returned, so idle processes still keep at most pool_size open.
    kwargs.setdefault("max_overflow", 40)
    if pool_size is not None:
        kwargs["pool_size"] = pool_size
    return create_engine(database_url, **kwargs)


def _configure_sqlite(engine: Engine, is_file: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let SQLAlchemy emit BEGIN itself
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        if is_file:
            cursor.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit is durable once written to the WAL file (survives a kill -9 of the process;
            # only an OS crash or power loss can drop the last commits); FULL would fsync on every commit, and
            # each inference request commits its usage row before its first token.
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        is_write = conn.get_execution_options().get(WRITE_TRANSACTION_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if is_write else "BEGIN")


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit (the API returns them)."""
    return sessionmaker(bind=engine, expire_on_commit=False)


def begin_write(session: Session) -> None:
    """Start `session`'s next transaction as a write transaction (SQLite: BEGIN IMMEDIATE).

    The session must have no transaction open: commit or roll back first. A session joined to an outer
    transaction (tests) gets a SAVEPOINT as before.
    """
    if session.in_transaction():
        raise RuntimeError("begin_write starts a new transaction: commit or roll back the session first")
    session.connection(execution_options={WRITE_TRANSACTION_OPTION: True})


def is_transient_error(exc: BaseException) -> bool:
    """True for errors after which the same transaction can succeed when run again: SQLite lock/busy
    errors, PostgreSQL serialization failures, deadlocks and lock timeouts."""
    if not isinstance(exc, DBAPIError):
        return False
    if getattr(exc.orig, "sqlstate", None) in TRANSIENT_SQLSTATES:
        return True
    message = str(exc.orig).lower()
    return any(text in message for text in SQLITE_TRANSIENT_MESSAGES)


def is_insert_conflict(exc: BaseException) -> bool:
    """is_transient_error, or a unique-constraint violation: for inserts that check for an existing row first,
    so that run again they find the concurrent winner's row (and refuse, or use it)."""
    return isinstance(exc, IntegrityError) or is_transient_error(exc)


def run_in_write_transaction(
    session: Session,
    work: Callable[[Session], T],
    *,
    is_retryable: Callable[[BaseException], bool] = is_transient_error,
    max_attempts: int = MAX_WRITE_ATTEMPTS,
) -> T:
    """Run `work(session)` in a write transaction and commit it; returns what `work` returned.

    On an error the transaction is rolled back; it is run again from the start (after a short jittered
    pause) while `is_retryable(error)` holds and attempts remain, else the error is raised. `work` must be
    safe to repeat: it reads what it needs inside the transaction and does no file or network I/O.
    """
    for attempt in range(1, max_attempts + 1):
        begin_write(session)
        try:
            result = work(session)
            session.commit()
            return result
        except BaseException as exc:
            session.rollback()
            if attempt == max_attempts or not isinstance(exc, Exception) or not is_retryable(exc):
                raise
            log.info("write transaction attempt %d failed (%s); retrying", attempt, type(exc).__name__)
        time.sleep(random.uniform(0, RETRY_BASE_DELAY_S * attempt))
    raise AssertionError("unreachable")  # the loop returns or raises
