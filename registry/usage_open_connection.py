"""A connection of its own for the usage writer's opener on PostgreSQL: opened rows inserted in autocommit mode.

A request's first token waits for its `in_progress` row (api/metering.py), and the opener's thread needs the
interpreter lock back after every round trip to the database: on a busy event loop each such wake-up waits up to
the interpreter's switch interval (5 ms). Through a pooled session a batch cost four round trips (the pool's
pre-ping, BEGIN, the INSERT, COMMIT) and ~0.45 ms of the thread's CPU; here it is one statement, atomic by
itself (registry/usage.py insert_open_rows: one INSERT of binary arrays), one round trip, on a connection the
opener keeps (benchmarks/RESULTS.md, Chaos & scale sixteenth pass).

A batch whose rows started before today (a request opened across midnight) changes a day the rollup may have
summed: it is written through a session, with the un-roll in the same transaction (registry/usage.py open_usage).
Any error closes the connection (the next batch opens another) and is raised as the session's would be.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, Engine

from registry.usage import insert_open_rows
from registry.usage_rollup import past_days


class OpenUsageConnection:
    """Inserts opened usage rows over one autocommit connection (module doc); thread-safe (one batch at a time)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connection: Connection | None = None
        self._lock = threading.Lock()

    @staticmethod
    def is_supported(engine: Engine) -> bool:
        """Whether the engine's database is PostgreSQL through psycopg (SQLite keeps its write transactions)."""
        return engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"

    @staticmethod
    def is_insertable(rows: Sequence[dict[str, object]]) -> bool:
        """Whether these rows may be inserted without a transaction: none started before today."""
        return not past_days(cast(datetime | None, row.get("started_at")) for row in rows)

    def insert(self, rows: Sequence[dict[str, object]]) -> None:
        """Insert the rows in one statement (all or none); raises what the database raised."""
        with self._lock:
            if self._connection is None:
                self._connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                insert_open_rows(self._connection, rows)
                self._connection.commit()  # no round trip: ends SQLAlchemy's own transaction only
            except BaseException:
                self._close()
                raise

    def close(self) -> None:
        """Give the connection back (a later insert opens another)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
