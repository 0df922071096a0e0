"""A connection of its own for each of the usage writer's opener and finisher on PostgreSQL, in autocommit mode.

A request's first token waits for its `in_progress` row and its stream's end for its final values
(api/metering.py), and a writer thread needs the interpreter lock back after every round trip to the database: on
a busy event loop each such wake-up waits up to the interpreter's switch interval (5 ms). Through a pooled session
an opener's batch cost four round trips (the pool's pre-ping, BEGIN, the INSERT, COMMIT) and ~0.45 ms of the
thread's CPU, a finisher's batch of n rows n + 4; here a batch is one statement, atomic by itself
(registry/usage_batches.py insert_open_rows, finish_open_rows: binary arrays), one round trip, on a connection the
thread keeps (benchmarks/RESULTS.md, Chaos & scale sixteenth pass). The statement runs on the driver's own
connection, through a cursor kept with it: SQLAlchemy's execution context cost the thread another ~60 us per
statement (benchmarks/RESULTS.md, Chaos & scale eighteenth pass).

Opened rows that started before today (a request opened across midnight) change a day the rollup may have summed:
`is_insertable` is False for them and the writer goes through a session, with the un-roll in the same transaction
(registry/usage_batches.py open_usage). Any error closes the connection (the next batch opens another) and is
raised as the session's would be.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

import psycopg
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from registry.usage_batches import (
    DriverStatement,
    finish_rows_statement,
    insert_open_rows,
    open_rows_statement,
    unfinished,
)
from registry.usage_rollup import past_days

T = TypeVar("T")


class AutocommitUsageConnection:
    """Writes usage rows over one autocommit connection (module doc); thread-safe (one write at a time)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connection: Connection | None = None
        self._cursor: Any = None  # the driver connection's psycopg cursor, kept as long as the connection
        self._lock = threading.Lock()

    @staticmethod
    def is_supported(engine: Engine) -> bool:
        """Whether the engine's database is PostgreSQL through psycopg (SQLite keeps its write transactions)."""
        return engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"

    @staticmethod
    def is_insertable(rows: Sequence[dict[str, object]]) -> bool:
        """Whether these opened rows may be inserted without a transaction: none started before today."""
        return not past_days(cast(datetime | None, row.get("started_at")) for row in rows)

    def insert(self, rows: Sequence[dict[str, object]]) -> None:
        """Insert opened rows in one statement (all or none); raises what the database raised."""
        statement = open_rows_statement(rows, self.engine.dialect) if rows else None
        if statement is None:
            self._write(lambda connection: insert_open_rows(connection, rows))
        else:
            self._execute(statement)

    def finish(self, rows: Sequence[dict[str, object]]) -> list[str] | None:
        """Give open rows their final values in one statement (all or none); returns the request ids that had no
        open row, or None, writing nothing, when the rows do not share their columns (registry/usage_batches.py
        finish_rows_statement)."""
        statement = finish_rows_statement(rows, self.engine.dialect)
        if statement is None:
            return None
        return unfinished(rows, {cast(str, row[0]) for row in self._execute(statement)})

    def close(self) -> None:
        """Give the connection back (a later write opens another)."""
        with self._lock:
            self._close()

    def _execute(self, statement: DriverStatement) -> list[tuple[object, ...]]:
        """Run one driver statement on the connection's psycopg cursor; the rows it returned."""
        with self._lock:
            try:
                if self._cursor is None:
                    driver = self._connect().connection.driver_connection
                    assert driver is not None and driver.autocommit  # type: ignore[attr-defined]
                    self._cursor = driver.cursor()  # type: ignore[attr-defined]
                cursor = self._cursor
                cursor.execute(*statement)
                return list(cursor.fetchall()) if cursor.description is not None else []
            except psycopg.Error as exc:  # as SQLAlchemy raises it (IntegrityError, OperationalError, ...)
                self._close()
                raise DBAPIError.instance(statement[0], statement[1], exc, psycopg.Error) from exc
            except BaseException:
                self._close()
                raise

    def _write(self, write: Callable[[Connection], T]) -> T:
        with self._lock:
            connection = self._connect()
            try:
                result = write(connection)
                connection.commit()  # no round trip: ends SQLAlchemy's own transaction only
                return result
            except BaseException:
                self._close()
                raise

    def _connect(self) -> Connection:
        if self._connection is None:
            self._connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return self._connection

    def _close(self) -> None:
        connection, self._connection, cursor, self._cursor = self._connection, None, self._cursor, None
        if cursor is not None:
            cursor.close()  # a client-side cursor: frees its results, never fails on a broken connection
        if connection is not None:
            connection.close()
