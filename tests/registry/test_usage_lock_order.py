"""The usage writers that change several rows in one transaction lock them in one order (request_id), so two of
them never deadlock (PostgreSQL: a finisher's batch and a checkpoint did, 1-2 times in a run of 2,000 streams);
a lease renewal never waits for a row at all.

The property checked: a writer that waits for a row holds no row after it in that order. Rows are inserted in
the reverse of that order, and the writers are handed them reversed, so neither the table's physical order nor
the caller's order can pass for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from registry import repository
from registry.db import make_engine
from registry.models import new_id
from registry.usage import close_interrupted_usage, renew_usage_leases
from registry.usage_batches import checkpoint_usage, finish_open_usage, open_usage

pytestmark = pytest.mark.slow  # PostgreSQL only: SQLite locks the whole database on a write

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NUM_ROWS = 3
WAIT_S = 30.0


def _checkpoint(request_id: str) -> dict[str, Any]:
    return {"request_id": request_id, "prompt_tokens": 7, "completion_tokens": 3, "ttft_ms": 5.0,
            "tpot_ms": 1.0, "e2e_ms": 50.0, "worker_id": "w-1", "checkpointed_at": T0}  # fmt: skip


WRITERS: dict[str, Callable[[Session, list[str], str], object]] = {
    "finisher batch": lambda session, ids, owner: finish_open_usage(
        session, [{"request_id": r, "status": "ok", "completion_tokens": 3} for r in reversed(ids)]
    ),
    "checkpoint": lambda session, ids, owner: checkpoint_usage(
        session, [_checkpoint(r) for r in reversed(ids)]
    ),
    "restart sweep": lambda session, ids, owner: close_interrupted_usage(session, owner),
}


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    engine = make_engine(postgres_url)
    yield engine
    engine.dispose()


@pytest.fixture
def owner(engine: Engine) -> Iterator[str]:
    """The API instance owning the test's rows, which are committed (the writers run in transactions of their
    own): deleted afterwards, so no open row of a worker `w-1` is left for another test's sweep to find."""
    owner = f"api-{new_id()[:8]}"
    yield owner
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM usage_records WHERE api_instance_id = :o"), {"o": owner})


def _open_rows(sessions: sessionmaker[Session], owner: str) -> list[str]:
    """NUM_ROWS open rows of `owner`, inserted last-first; their request ids in request_id order."""
    prefix = f"req-{new_id()}"
    request_ids = [f"{prefix}-{index}" for index in range(NUM_ROWS)]
    with sessions() as session:
        tenant_id = repository.create_tenant(session, f"t-{new_id()[:8]}").id
        session.commit()
        for request_id in reversed(request_ids):
            open_usage(session, [{"request_id": request_id, "tenant_id": tenant_id, "model_name": "m",
                                  "prompt_tokens": 0, "completion_tokens": 0, "status": "in_progress",
                                  "api_instance_id": owner, "worker_id": "w-1", "started_at": T0}])  # fmt: skip
    return request_ids


def _wait_for_a_lock_wait(engine: Engine, backend_pid: int) -> None:
    """Until the backend backend_pid waits for a row lock (the writer reached the row the test holds)."""
    deadline = time.monotonic() + WAIT_S
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            query = text("SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = :pid")
            if conn.execute(query, {"pid": backend_pid}).scalar_one():
                return
            conn.rollback()
            time.sleep(0.01)  # polling PostgreSQL's lock table: nothing to wait on from here
    pytest.fail(f"the writer never waited for the held row within {WAIT_S} s")


def _is_free(engine: Engine, request_id: str) -> bool:
    """Whether no other transaction holds the row's lock (FOR UPDATE NOWAIT fails at once when one does)."""
    with engine.connect() as conn:
        try:
            query = text("SELECT 1 FROM usage_records WHERE request_id = :r FOR UPDATE NOWAIT")
            conn.execute(query, {"r": request_id})
            return True
        except OperationalError:
            return False
        finally:
            conn.rollback()


@pytest.mark.parametrize("writer", WRITERS)
def test_a_usage_writer_waiting_for_a_row_holds_none_after_it_in_request_order(
    engine: Engine, owner: str, writer: str
) -> None:
    sessions = sessionmaker(engine, expire_on_commit=False)
    first, *later = _open_rows(sessions, owner)
    errors: list[BaseException] = []
    with engine.connect() as holder:  # holds the first row in request order: the writer must wait there
        holder.execute(text("SELECT 1 FROM usage_records WHERE request_id = :r FOR UPDATE"), {"r": first})
        session = sessions()
        backend_pid = session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

        def write() -> None:
            try:
                WRITERS[writer](session, [first, *later], owner)
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)
            finally:
                session.close()

        thread = threading.Thread(target=write)
        thread.start()
        try:
            _wait_for_a_lock_wait(engine, backend_pid)
            held = [request_id for request_id in later if not _is_free(engine, request_id)]
        finally:
            holder.rollback()
            thread.join(WAIT_S)
    assert not thread.is_alive() and not errors
    assert held == [], f"{writer} held {held} while waiting for {first}: two such writers can deadlock"


def test_a_lease_renewal_skips_a_row_another_transaction_holds_instead_of_waiting(
    engine: Engine, owner: str
) -> None:
    sessions = sessionmaker(engine, expire_on_commit=False)
    first, *later = _open_rows(sessions, owner)
    with engine.connect() as holder:  # a final or a checkpoint holding the row
        holder.execute(text("SELECT 1 FROM usage_records WHERE request_id = :r FOR UPDATE"), {"r": first})
        with sessions() as session:
            session.execute(text("SET LOCAL lock_timeout = '5s'"))  # a wait for the held row fails the test
            assert renew_usage_leases(session, owner, T0) == len(later)
        holder.rollback()
    with sessions() as session:
        renewed = session.execute(
            text("SELECT request_id FROM usage_records WHERE api_instance_id = :o AND lease_renewed_at = :t"),
            {"o": owner, "t": T0},
        ).scalars()
        assert sorted(renewed) == later
