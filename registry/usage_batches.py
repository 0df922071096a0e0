"""The batched writes of open usage rows (the usage writer's statements, api/usage_writer.py): opened rows inserted,
open rows checkpointed and given their final values, each batch in one statement on PostgreSQL (binary arrays,
psycopg `%b`), and rows of several requests always locked in one order (registry/usage.py in_lock_order).

The row lifecycle these statements implement is registry/usage.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, Dialect, Table, bindparam, insert, update
from sqlalchemy.orm import Session

from registry.model_base import new_id
from registry.models import OPEN_USAGE_STATUS, UsageRecord
from registry.usage import finish_statement, in_lock_order
from registry.usage_rollup import unroll_days_of


def open_usage(session: Session, rows: Sequence[dict[str, object]]) -> None:
    """Insert `in_progress` rows, all in one transaction (none is written if one fails)."""
    if not rows:
        return
    unroll_days_of(session, [cast(datetime | None, row.get("started_at")) for row in rows])
    insert_open_rows(session.connection(), rows)
    session.commit()


def insert_open_rows(connection: Connection, rows: Sequence[dict[str, object]]) -> None:
    """Insert `in_progress` rows in one statement (none is written if one fails); the caller commits, and un-rolls
    the days before today the rows started in, if any (open_usage does both).

    This runs once per request, beside the request's hot path: on PostgreSQL one driver statement
    (open_rows_statement), when the rows share their columns (they do: RequestMeter.open_values); else a Core
    INSERT (no ORM unit of work).
    """
    if not rows:
        return
    statement = open_rows_statement(rows, connection.dialect)
    if statement is None:
        connection.execute(insert(cast(Table, UsageRecord.__table__)), list(rows))
        return
    connection.exec_driver_sql(*statement)


# A statement for psycopg (`%b` placeholders: binary parameters) and its parameters.
DriverStatement = tuple[str, tuple[object, ...]]


def open_rows_statement(rows: Sequence[dict[str, object]], dialect: Dialect) -> DriverStatement | None:
    """The one statement inserting these opened rows on PostgreSQL through psycopg; None elsewhere, or when the
    rows do not share their columns or lack a defaulted one.

    One row (a request opened while no other was: the common case below a few hundred requests a second) is one
    VALUES row of binary scalars; several are one binary array per column, unnested by the server, as the
    checkpoints are. psycopg dumps a scalar in C but an array through Python per column: an opened row's ~25
    one-element arrays cost the writer's thread ~4x the CPU of its scalars (benchmarks/RESULTS.md, Chaos & scale,
    eighteenth pass), holding the interpreter lock the event loop needs.
    """
    columns = tuple(rows[0])
    is_uniform = _DEFAULTED_COLUMNS.issubset(columns) and all(tuple(row) == columns for row in rows)
    if dialect.driver != "psycopg" or not is_uniform:
        return None
    has_id = "id" in columns
    names = columns if has_id else ("id", *columns)
    if len(rows) == 1:
        values = ([] if has_id else [new_id()]) + [rows[0][name] for name in columns]
        return _insert_statement(names, dialect, is_arrays=False), tuple(values)
    ids = [] if has_id else [new_id() for _ in rows]
    arrays = ([ids] if not has_id else []) + [[row[name] for row in rows] for name in columns]
    return _insert_statement(names, dialect, is_arrays=True), tuple(arrays)


_INSERT_STATEMENTS: dict[tuple[tuple[str, ...], bool], str] = {}
# the columns whose default the model sets (the server sets none): the statement carries them, or a Core INSERT
# runs
_DEFAULTED_COLUMNS = frozenset(
    column.name
    for column in cast(Table, UsageRecord.__table__).c
    if column.default is not None and column.name != "id"
)


def _insert_statement(names: tuple[str, ...], dialect: Dialect, *, is_arrays: bool) -> str:
    """`INSERT INTO usage_records (names) VALUES (one scalar per column)`, or `... SELECT * FROM unnest(one array
    per column)`, built once per column set."""
    statement = _INSERT_STATEMENTS.get((names, is_arrays))
    if statement is None:
        placeholders = _typed_placeholders(names, dialect, is_arrays=is_arrays)
        source = f"SELECT * FROM unnest({placeholders})" if is_arrays else f"VALUES ({placeholders})"
        statement = f"INSERT INTO usage_records ({', '.join(names)}) {source}"
        _INSERT_STATEMENTS[(names, is_arrays)] = statement
    return statement


def _typed_placeholders(names: tuple[str, ...], dialect: Dialect, *, is_arrays: bool) -> str:
    """`%b::type` (or `%b::type[]`) per column of usage_records, in order."""
    table = cast(Table, UsageRecord.__table__)
    suffix = "[]" if is_arrays else ""
    return ", ".join(f"%b::{table.c[name].type.compile(dialect=dialect)}{suffix}" for name in names)


CHECKPOINT_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "worker_id",
    "checkpointed_at",
)
_CHECKPOINT = (
    update(cast(Table, UsageRecord.__table__))
    .where(UsageRecord.request_id == bindparam("b_request_id"), UsageRecord.status == OPEN_USAGE_STATUS)
    .values({name: bindparam(f"b_{name}") for name in CHECKPOINT_FIELDS})
)


# in_lock_order for the open rows of a list of requests, the list one binary array (an IN of 1,000 bound values
# costs the writer's thread milliseconds of CPU, holding the interpreter lock the event loop needs)
_LOCK_OPEN_ROWS = (
    "SELECT id FROM usage_records WHERE request_id = ANY(%b::text[]) "
    f"AND status = '{OPEN_USAGE_STATUS}' ORDER BY request_id FOR UPDATE"
)


def _lock_open_rows(session: Session, request_ids: list[object]) -> None:
    """Lock the open rows of these requests in request_id order (in_lock_order); SQLite needs no row locks."""
    connection = session.connection()
    if connection.dialect.driver == "psycopg":
        connection.exec_driver_sql(_LOCK_OPEN_ROWS, (request_ids,))
    elif connection.dialect.name != "sqlite":
        session.execute(
            in_lock_order(UsageRecord.request_id.in_(request_ids) & (UsageRecord.status == OPEN_USAGE_STATUS))
        )


# PostgreSQL: every checkpoint in one statement, each column one array (an executemany is one UPDATE per row:
# twice the client CPU and wall time for 1,000 rows, benchmarks/RESULTS.md); a request_id is unique. The arrays
# are sent binary (`%b`: psycopg writes no text, so 1,000 checkpoints cost ~2 ms of the writer's CPU, not ~9 ms).
_CHECKPOINT_ARRAYS = (
    "UPDATE usage_records SET prompt_tokens = c.prompt_tokens, completion_tokens = c.completion_tokens, "
    "ttft_ms = c.ttft_ms, tpot_ms = c.tpot_ms, e2e_ms = c.e2e_ms, worker_id = c.worker_id, "
    "checkpointed_at = c.checkpointed_at "
    "FROM unnest(%b::text[], %b::integer[], %b::integer[], %b::double precision[], %b::double precision[], "
    "%b::double precision[], %b::text[], %b::timestamptz[]) "
    "AS c(request_id, prompt_tokens, completion_tokens, ttft_ms, tpot_ms, e2e_ms, worker_id, checkpointed_at) "
    f"WHERE usage_records.request_id = c.request_id AND usage_records.status = '{OPEN_USAGE_STATUS}'"
)
_FLOAT_CHECKPOINT_FIELDS = frozenset({"ttft_ms", "tpot_ms", "e2e_ms"})  # a binary array holds one type


def checkpoint_usage(session: Session, checkpoints: Sequence[dict[str, object]]) -> None:
    """Update the tokens and latencies of still-open rows, all in one transaction (closed rows are left alone).

    Each checkpoint has `request_id` and every CHECKPOINT_FIELDS key.
    """
    if not checkpoints:
        return
    _lock_open_rows(session, [c["request_id"] for c in checkpoints])
    connection = session.connection()
    if connection.dialect.driver == "psycopg":
        connection.exec_driver_sql(
            _CHECKPOINT_ARRAYS,
            tuple(_column(checkpoints, name) for name in ("request_id", *CHECKPOINT_FIELDS)),
        )
    else:
        params = [{f"b_{name}": value for name, value in c.items()} for c in checkpoints]
        connection.execute(_CHECKPOINT, params)
    session.commit()


def _column(checkpoints: Sequence[dict[str, object]], name: str) -> list[object]:
    if name in _FLOAT_CHECKPOINT_FIELDS:
        return [None if c[name] is None else float(cast(float, c[name])) for c in checkpoints]
    return [c[name] for c in checkpoints]


def finish_open_usage(session: Session, rows: Sequence[dict[str, object]]) -> list[str]:
    """Give open rows their final values, all in one transaction; returns the request ids that had no open row
    (swept, or never opened: finish_usage / record_usage take them, one by one), changing nothing for those.

    On PostgreSQL one statement for all (finish_open_rows); elsewhere one UPDATE per row (its rowcount says
    whether the row was open) and one commit for all: a request's end costs a statement, not a transaction
    (benchmarks/RESULTS.md).
    """
    if not rows:
        return []
    missing = finish_open_rows(session.connection(), rows)
    if missing is None:
        _lock_open_rows(session, [values["request_id"] for values in rows])
        missing = []
        for values in rows:
            fields = tuple(sorted(k for k in values if k != "request_id"))
            params = {f"b_{name}": value for name, value in values.items()}
            result = cast(
                CursorResult[Any],
                session.connection().execute(finish_statement(fields, OPEN_USAGE_STATUS), params),
            )
            if not result.rowcount:
                missing.append(cast(str, values["request_id"]))
    session.commit()
    return missing


def finish_open_rows(connection: Connection, rows: Sequence[dict[str, object]]) -> list[str] | None:
    """Give open rows their final values in one statement, atomic by itself (the caller commits); returns the
    request ids that had no open row, changing nothing for those. None, writing nothing, unless the database is
    PostgreSQL through psycopg and the rows share their columns (they do: RequestMeter.usage_values).
    """
    statement = finish_rows_statement(rows, connection.dialect)
    if statement is None:
        return None
    finished = set(connection.exec_driver_sql(*statement).scalars())
    return unfinished(rows, finished)


def finish_rows_statement(rows: Sequence[dict[str, object]], dialect: Dialect) -> DriverStatement | None:
    """The one statement giving these open rows their final values on PostgreSQL through psycopg, returning the
    request ids it finished; None elsewhere or when the rows do not share their columns.

    One row is one VALUES row of binary scalars, several one binary array per column (as open_rows_statement);
    the rows are locked in request_id order by the statement's own sub-select (in_lock_order), so it never
    deadlocks with another multi-row writer.
    """
    columns = tuple(rows[0]) if rows else ()
    if dialect.driver != "psycopg" or not rows or not all(tuple(row) == columns for row in rows):
        return None
    request_ids = [cast(str, row["request_id"]) for row in rows]
    is_arrays = len(rows) > 1
    if is_arrays:
        values: tuple[object, ...] = tuple([row[name] for row in rows] for name in columns)
    else:
        values = tuple(rows[0][name] for name in columns)
    return _finish_statement(columns, dialect, is_arrays=is_arrays), (*values, request_ids)


def unfinished(rows: Sequence[dict[str, object]], finished: set[str]) -> list[str]:
    """The request ids of `rows` not among those a finish statement returned (no open row: changed nothing)."""
    return [cast(str, row["request_id"]) for row in rows if row["request_id"] not in finished]


_FINISH_STATEMENTS: dict[tuple[tuple[str, ...], bool], str] = {}


def _finish_statement(names: tuple[str, ...], dialect: Dialect, *, is_arrays: bool) -> str:
    """The UPDATE ... FROM (VALUES row | unnest(arrays)) of finish_rows_statement for this column set (request_id
    among them), built once per column set."""
    statement = _FINISH_STATEMENTS.get((names, is_arrays))
    if statement is None:
        fields = [name for name in names if name != "request_id"]
        placeholders = _typed_placeholders(names, dialect, is_arrays=is_arrays)
        source = f"unnest({placeholders})" if is_arrays else f"(VALUES ({placeholders}))"
        statement = (
            f"UPDATE usage_records SET {', '.join(f'{name} = c.{name}' for name in fields)} "
            f"FROM {source} AS c({', '.join(names)}) "
            f"WHERE usage_records.request_id = c.request_id AND usage_records.status = '{OPEN_USAGE_STATUS}' "
            f"AND usage_records.id IN ({_LOCK_OPEN_ROWS}) RETURNING usage_records.request_id"
        )
        _FINISH_STATEMENTS[(names, is_arrays)] = statement
    return statement
