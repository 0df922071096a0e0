"""Usage rows on PostgreSQL opened and finished in one statement each, a VALUES row of binary scalars for one row
and binary arrays for several (registry/usage_batches.py open_rows_statement, finish_rows_statement), over a writer thread's own autocommit connection
(registry/usage_autocommit.py), and through the usage writer.

Rows are committed for real (an autocommit connection cannot join a test's rolled-back transaction): each test
makes its own tenant and request ids and reads back only those.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

import pytest
from sqlalchemy import Engine, Table, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.usage_writer import UsageWriter
from registry import repository
from registry.db import make_engine
from registry.models import RolledUsageDay, UsageRecord, new_id, utcnow
from registry.usage_autocommit import AutocommitUsageConnection
from registry.usage_batches import open_usage

LONG_AGO = date(2001, 2, 3)  # a day no other test writes usage in


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    engine = make_engine(postgres_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@pytest.fixture
def tenant_id(sessions: sessionmaker[Session]) -> str:
    with sessions() as session:
        tenant = repository.create_tenant(session, f"t-{new_id()[:8]}")
        session.commit()
        return tenant.id


def _open_row(tenant_id: str, index: int, **overrides: Any) -> dict[str, Any]:
    """A row as RequestMeter.open_values writes it; NULLs and values mixed across rows."""
    row = {
        "request_id": f"req-{new_id()}",
        "tenant_id": tenant_id,
        "adapter_id": None,
        "adapter_version_id": None,
        "model_name": f"model-{index}",
        "base_model_name": None if index % 2 else "base",
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "predicted_output_tokens": None if index % 3 == 0 else 10 + index,
        "max_tokens": 64,
        "is_chat": index % 2 == 0,
        "has_stop": None if index == 1 else False,
        "status": "in_progress",
        "worker_id": "w-1",
        "api_instance_id": "api-test",
        "started_at": utcnow() - timedelta(milliseconds=index),
        "lease_renewed_at": utcnow(),
    }
    return row | overrides


def _columns(sessions: sessionmaker[Session], request_ids: list[str]) -> list[dict[str, Any]]:
    """Every column of these rows but the id, in request order."""
    with sessions() as session:
        records = session.scalars(select(UsageRecord).where(UsageRecord.request_id.in_(request_ids))).all()
    by_request = {r.request_id: r for r in records}
    names = [c.name for c in UsageRecord.__table__.columns if c.name != "id"]
    return [{name: getattr(by_request[r], name) for name in names} for r in request_ids if r in by_request]


@pytest.mark.parametrize("is_one_by_one", [False, True], ids=["arrays", "values"])
def test_opened_rows_read_back_as_a_core_insert_writes_them(
    engine: Engine, sessions: sessionmaker[Session], tenant_id: str, is_one_by_one: bool
) -> None:
    rows = [_open_row(tenant_id, index) for index in range(5)]
    twins = [row | {"request_id": f"{row['request_id']}-core"} for row in rows]
    connection = AutocommitUsageConnection(engine)
    for batch in [[row] for row in rows] if is_one_by_one else [rows]:  # one row: a VALUES row of scalars
        connection.insert(batch)
    connection.close()
    with engine.begin() as conn:
        conn.execute(insert(cast(Table, UsageRecord.__table__)), twins)
    written = _columns(sessions, [row["request_id"] for row in rows])
    expected = _columns(sessions, [row["request_id"] for row in twins])
    assert len(written) == len(rows) == len(expected)
    for got, want, row in zip(written, expected, rows, strict=True):
        assert got | {"request_id": None} == want | {"request_id": None}
        assert got["started_at"] == row["started_at"]


def test_a_batch_is_written_whole_or_not_at_all_and_the_next_one_goes_through(
    engine: Engine, sessions: sessionmaker[Session], tenant_id: str
) -> None:
    connection = AutocommitUsageConnection(engine)
    first = _open_row(tenant_id, 0)
    connection.insert([first])
    with pytest.raises(IntegrityError):  # as SQLAlchemy raises it, for one row as for several
        connection.insert([first | {"model_name": "again"}])
    batch = [_open_row(tenant_id, 1), first | {"model_name": "again"}, _open_row(tenant_id, 2)]
    with pytest.raises(IntegrityError):  # first's request id is metered already
        connection.insert(batch)
    assert [r["request_id"] for r in _columns(sessions, [row["request_id"] for row in batch])] == [
        first["request_id"]
    ]
    later = _open_row(tenant_id, 3)
    connection.insert([later])
    connection.close()
    assert _columns(sessions, [later["request_id"]])[0]["model_name"] == "model-3"


def test_only_rows_that_started_today_skip_the_transaction() -> None:
    now = datetime.now(UTC)
    assert AutocommitUsageConnection.is_insertable([{"started_at": now}, {"started_at": now}])
    assert not AutocommitUsageConnection.is_insertable(
        [{"started_at": now}, {"started_at": now - timedelta(days=1)}]
    )


def test_rows_missing_a_defaulted_column_get_the_models_default(
    sessions: sessionmaker[Session], tenant_id: str
) -> None:
    bare = {k: v for k, v in _open_row(tenant_id, 0).items() if k not in ("prompt_tokens", "started_at")}
    with sessions() as session:
        open_usage(session, [bare])
    written = _columns(sessions, [bare["request_id"]])
    assert written[0]["prompt_tokens"] == 0 and written[0]["started_at"] is not None


def test_the_writer_opens_rows_at_once_and_a_row_of_a_rolled_day_unrolls_it(
    engine: Engine, sessions: sessionmaker[Session], tenant_id: str
) -> None:
    with sessions() as session:
        session.merge(RolledUsageDay(day=LONG_AGO))
        session.commit()
    writer = UsageWriter(sessions, interval_s=60.0)
    today = _open_row(tenant_id, 0)
    late = _open_row(tenant_id, 1, started_at=datetime(2001, 2, 3, 23, 59, tzinfo=UTC))
    try:
        writer.open(today).result(timeout=30)
        writer.open(late).result(timeout=30)
    finally:
        writer.close()
    assert len(_columns(sessions, [today["request_id"], late["request_id"]])) == 2
    with sessions() as session:
        assert session.get(RolledUsageDay, LONG_AGO) is None  # its sums are read raw until rolled again


def test_the_writer_fails_a_bad_row_alone(sessions: sessionmaker[Session], tenant_id: str) -> None:
    writer = UsageWriter(sessions, interval_s=60.0)
    good = [_open_row(tenant_id, index) for index in range(3)]
    bad = _open_row(f"no-such-tenant-{new_id()}", 9)
    try:
        futures = [writer.open(row) for row in (good[0], bad, *good[1:])]
        errors = [future.exception(timeout=30) for future in futures]
    finally:
        writer.close()
    assert [error is None for error in errors] == [True, False, True, True]
    assert isinstance(errors[1], IntegrityError)
    assert len(_columns(sessions, [row["request_id"] for row in good])) == 3


def _final(row: dict[str, Any], completion_tokens: int) -> dict[str, Any]:
    """A final as the writer gives it (RequestMeter.usage_values less the admission fields)."""
    return {
        "request_id": row["request_id"], "tenant_id": row["tenant_id"], "adapter_id": None,
        "adapter_version_id": None, "model_name": row["model_name"], "base_model_name": row["base_model_name"],
        "prompt_tokens": 7, "completion_tokens": completion_tokens, "predicted_output_tokens": None,
        "ttft_ms": 5.0, "tpot_ms": None if completion_tokens < 2 else 1.5, "e2e_ms": 40.0, "status": "ok",
        "worker_id": "w-2", "error_message": None, "started_at": row["started_at"], "finished_at": utcnow(),
    }  # fmt: skip


@pytest.mark.parametrize("is_one_by_one", [False, True], ids=["arrays", "values"])
def test_finals_update_the_open_rows_alone_and_name_those_that_were_not_open(
    engine: Engine, sessions: sessionmaker[Session], tenant_id: str, is_one_by_one: bool
) -> None:
    rows = [_open_row(tenant_id, index) for index in range(4)]
    connection = AutocommitUsageConnection(engine)
    connection.insert(rows)
    swept = rows[1]["request_id"]
    with engine.begin() as conn:
        conn.execute(update(UsageRecord).where(UsageRecord.request_id == swept).values(status="interrupted"))
    never = _open_row(tenant_id, 9)
    finals = list(reversed([_final(row, 5 * index) for index, row in enumerate([*rows, never])]))
    left: list[str] = []
    for batch in [[final] for final in finals] if is_one_by_one else [finals]:
        batch_left = connection.finish(batch)
        assert batch_left is not None
        left += batch_left
    connection.close()
    assert sorted(left) == sorted([swept, never["request_id"]])
    written = _columns(sessions, [row["request_id"] for row in rows])
    assert [(r["status"], r["completion_tokens"], r["worker_id"]) for r in written] == [
        ("ok", 0, "w-2"), ("interrupted", 0, "w-1"), ("ok", 10, "w-2"), ("ok", 15, "w-2")
    ]  # fmt: skip
    assert written[0]["tpot_ms"] is None and written[2]["tpot_ms"] == 1.5 and written[0]["prompt_tokens"] == 7
    assert written[0]["max_tokens"] == 64  # an admission field, written at open, kept


def test_finals_of_differing_columns_are_left_to_the_session(engine: Engine, tenant_id: str) -> None:
    row = _open_row(tenant_id, 0)
    connection = AutocommitUsageConnection(engine)
    connection.insert([row])
    final = _final(row, 3)
    assert connection.finish([final, {"request_id": "other", "status": "ok"}]) is None
    assert connection.finish([final]) == []
    connection.close()


def test_the_writer_finishes_opened_rows(sessions: sessionmaker[Session], tenant_id: str) -> None:
    writer = UsageWriter(sessions, interval_s=60.0)
    rows = [_open_row(tenant_id, index) for index in range(3)]
    try:
        for row in rows:
            writer.open(row).result(timeout=30)
        admission = {"max_tokens": 64, "is_chat": True, "has_stop": False}
        futures = [writer.finish(_final(row, index) | admission, True) for index, row in enumerate(rows)]
        for future in futures:
            future.result(timeout=30)
    finally:
        writer.close()
    written = _columns(sessions, [row["request_id"] for row in rows])
    assert [(r["status"], r["completion_tokens"]) for r in written] == [("ok", 0), ("ok", 1), ("ok", 2)]
