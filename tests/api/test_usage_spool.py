"""Usage written through a database outage (api/usage_spool.py, api/metering.py): while the database cannot be
reached, opens, checkpoints and final writes go to the process's spool on local disk and count as written; the
writer replays them once the database answers, exactly once per request, never regressing a row the database
wrote meanwhile; a process restarted under the same id replays its predecessor's spool, whose open rows its
restart then closes as interrupted at their last spooled checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, event, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from api.metering import UsageLedger
from api.request_meter import RequestMeter
from api.usage_spool import UsageSpool, spool_path
from registry import repository
from registry.models import UsageRecord
from registry.usage import close_interrupted_usage

FAR_S = 3600.0  # checkpoints are called explicitly


class Outage:
    """A session factory that raises what a dropped PostgreSQL connection raises while `is_down`, or after
    `num_calls_left` more sessions."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory
        self.is_down = False
        self.num_calls_left: int | None = None

    def __call__(self) -> Session:
        if self.num_calls_left is not None:
            self.num_calls_left -= 1
            self.is_down = self.is_down or self.num_calls_left < 0
        if self.is_down:
            raise OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))
        return self.factory()


@pytest.fixture
def tenant_id(db_session: Session) -> str:
    tenant_id = repository.create_tenant(db_session, "spooled").id
    db_session.commit()
    return tenant_id


@pytest.fixture
def outage(db_session_factory: sessionmaker[Session]) -> Outage:
    return Outage(db_session_factory)


def _ledger(outage: Outage, tmp_path: Path) -> UsageLedger:
    spool = UsageSpool(spool_path(tmp_path, "api-test"))
    return UsageLedger(outage, api_instance_id="api-test", checkpoint_interval_s=FAR_S, spool=spool)  # type: ignore[arg-type]


def _meter(tenant_id: str) -> RequestMeter:
    meter = RequestMeter(tenant_id=tenant_id, model_name="lorahost-base", num_prompt_tokens=5)
    meter.worker_id = "w-1"
    return meter


def _rows(factory: sessionmaker[Session], tenant_id: str) -> list[tuple[Any, ...]]:
    with factory() as session:
        query = select(UsageRecord.status, UsageRecord.prompt_tokens, UsageRecord.completion_tokens)
        return [tuple(r) for r in session.execute(query.where(UsageRecord.tenant_id == tenant_id))]


async def _checkpointed_in_an_outage(
    outage: Outage, tmp_path: Path, tenant_id: str
) -> tuple[UsageLedger, RequestMeter]:
    """A stream opened in the database, then 4 tokens checkpointed into the spool during an outage, which ends."""
    ledger = _ledger(outage, tmp_path)
    meter = _meter(tenant_id)
    ledger.open(meter, is_checkpointed=True)
    await ledger.wait_opened(meter)  # opened in the database before the outage
    outage.is_down = True
    meter.on_delivered(4)
    ledger.writer.checkpoint()  # spooled: the checkpoint's columns, not the row's
    outage.is_down = False
    return ledger, meter


@pytest.mark.anyio
async def test_a_stream_served_through_an_outage_is_billed_once_from_the_spool(
    outage: Outage, db_session_factory: sessionmaker[Session], tenant_id: str, tmp_path: Path
) -> None:
    ledger = _ledger(outage, tmp_path)
    outage.is_down = True
    meter = _meter(tenant_id)
    ledger.open(meter, is_checkpointed=True)
    await ledger.wait_opened(meter)  # durable in the spool: tokens may flow
    assert meter.opened is not None and meter.opened.exception() is None
    meter.on_delivered(3)
    ledger.writer.checkpoint()
    meter.on_delivered(2)
    await ledger.record(meter, "ok")
    assert _rows(db_session_factory, tenant_id) == []
    assert ledger.writer.spool is not None and ledger.writer.spool.num_pending() == 1
    outage.is_down = False
    assert ledger.writer.replay_spool() == 1
    assert _rows(db_session_factory, tenant_id) == [("ok", 5, 5)]
    assert not spool_path(tmp_path, "api-test").exists()
    assert ledger.writer.replay_spool() == 0
    ledger.close()


@pytest.mark.anyio
async def test_a_crash_in_an_outage_bills_the_last_spooled_checkpoint_after_the_restart(
    outage: Outage, db_session_factory: sessionmaker[Session], tenant_id: str, tmp_path: Path
) -> None:
    ledger = _ledger(outage, tmp_path)
    outage.is_down = True
    meter = _meter(tenant_id)
    ledger.open(meter, is_checkpointed=True)
    await ledger.wait_opened(meter)
    meter.on_delivered(3)
    ledger.writer.checkpoint()
    # kill -9 here: the process is gone, its spool file stays; it restarts under the same id, the database is back
    outage.is_down = False
    restarted = _ledger(outage, tmp_path)
    assert restarted.writer.replay_spool() == 1
    assert _rows(db_session_factory, tenant_id) == [("in_progress", 5, 3)]
    with db_session_factory() as session:
        assert close_interrupted_usage(session, "api-test") == 1
    assert _rows(db_session_factory, tenant_id) == [("interrupted", 5, 3)]


@pytest.mark.anyio
async def test_a_spooled_checkpoint_never_regresses_a_row_the_database_finished_meanwhile(
    outage: Outage, db_session_factory: sessionmaker[Session], tenant_id: str, tmp_path: Path
) -> None:
    ledger, meter = await _checkpointed_in_an_outage(outage, tmp_path, tenant_id)
    meter.on_delivered(2)
    await ledger.record(meter, "ok")  # written directly
    assert _rows(db_session_factory, tenant_id) == [("ok", 5, 6)]
    assert ledger.writer.replay_spool() == 1
    assert ledger.writer.replay_spool() == 0
    assert _rows(db_session_factory, tenant_id) == [("ok", 5, 6)]
    ledger.close()


@pytest.mark.anyio
async def test_a_spooled_checkpoint_of_a_row_opened_before_the_outage_is_replayed_as_an_update_alone(
    outage: Outage, db_connection: Connection, db_session_factory: sessionmaker[Session], tenant_id: str,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    with caplog.at_level("WARNING", logger="api.usage_writer"):
        ledger, meter = await _checkpointed_in_an_outage(outage, tmp_path, tenant_id)
    assert "1 checkpoints spooled" in caplog.text and "connection refused" in caplog.text
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement.lstrip().split()[0].upper())

    event.listen(db_connection, "before_cursor_execute", seen)
    try:
        assert ledger.writer.replay_spool() == 1
    finally:
        event.remove(db_connection, "before_cursor_execute", seen)
    assert "UPDATE" in statements and "INSERT" not in statements  # no insert tried (and refused) first
    assert _rows(db_session_factory, tenant_id) == [("in_progress", 5, 4)]
    await ledger.record(meter, "ok")
    assert _rows(db_session_factory, tenant_id) == [("ok", 5, 4)]
    ledger.close()


@pytest.mark.anyio
async def test_a_replay_that_meets_the_outage_again_keeps_what_it_could_not_write(
    outage: Outage, db_session_factory: sessionmaker[Session], tenant_id: str, tmp_path: Path
) -> None:
    ledger = _ledger(outage, tmp_path)
    outage.is_down = True
    for _ in range(3):
        meter = _meter(tenant_id)
        ledger.open(meter, is_checkpointed=False)
        await ledger.wait_opened(meter)
        meter.on_delivered(1)
        await ledger.record(meter, "ok")
    outage.is_down, outage.num_calls_left = False, 1
    assert ledger.writer.replay_spool() == 1
    assert ledger.writer.spool is not None and ledger.writer.spool.num_pending() == 2
    outage.is_down, outage.num_calls_left = False, None
    assert ledger.writer.replay_spool() == 2
    assert sorted(_rows(db_session_factory, tenant_id)) == [("ok", 5, 1)] * 3
    ledger.close()


def test_a_line_torn_by_a_crash_is_skipped_and_the_rest_replayed(
    db_session_factory: sessionmaker[Session], tenant_id: str, tmp_path: Path
) -> None:
    spool = UsageSpool(tmp_path / "spool.jsonl")
    meter = _meter(tenant_id)
    spool.add("final", meter.usage_values("ok", None))
    with spool.path.open("a") as f:
        f.write('{"kind": "final", "values": {"request_id": "to')
    assert spool.num_pending() == 1
    assert spool.replay(db_session_factory) == 1
    assert _rows(db_session_factory, tenant_id) == [("ok", 5, 0)]
    with pytest.raises(ValueError, match="one of"):
        spool.add("sideways", {"request_id": "x"})
