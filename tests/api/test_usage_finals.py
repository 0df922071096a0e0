"""The usage writer's finals (api/usage_writer.py): requests that ended meanwhile are given their final values in
one transaction, a row that was swept or never opened is written on its own, one bad row fails alone, and a
waiter's cancellation never leaves a queued write, or the others of its batch, unresolved."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

import api.usage_writer
from api.request_meter import RequestMeter
from api.usage_writer import UsageWriter
from registry import repository
from registry.models import INTERRUPTED_USAGE_STATUS, UsageRecord
from registry.usage_batches import finish_open_usage

FAR_S = 3600.0  # no periodic round in these tests: the writer's jobs are called by hand


@pytest.fixture
def tenant_id(db_session: Session) -> str:
    return repository.create_tenant(db_session, "finals").id


def _writer(factory: sessionmaker[Session]) -> UsageWriter:
    writer = UsageWriter(factory, FAR_S, api_instance_id="api-finals")
    writer._ensure_threads = lambda: None  # type: ignore[method-assign]  # flushed by hand
    return writer


def _opened(writer: UsageWriter, tenant_id: str, num: int) -> list[RequestMeter]:
    meters = [
        RequestMeter(tenant_id=tenant_id, model_name="lorahost-base", num_prompt_tokens=5) for _ in range(num)
    ]
    for meter in meters:
        writer.open(meter.open_values("api-finals"))
    writer.flush_opens()
    return meters


def _ended(meter: RequestMeter, num_tokens: int, status: str = "ok") -> dict[str, Any]:
    meter.worker_id = "w-1"
    meter.on_delivered(num_tokens)
    return meter.usage_values(status, None)


def _rows(factory: sessionmaker[Session], tenant_id: str) -> dict[str, tuple[str, int, int]]:
    with factory() as session:
        rows = session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id))
        return {r.request_id: (r.status, r.prompt_tokens, r.completion_tokens) for r in rows}


def test_finals_queued_together_are_written_in_one_transaction(
    db_session_factory: sessionmaker[Session], tenant_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(db_session_factory)
    meters = _opened(writer, tenant_id, 3)
    batches: list[int] = []

    def counted(session: Session, rows: list[dict[str, Any]]) -> list[str]:
        batches.append(len(rows))
        return finish_open_usage(session, rows)

    monkeypatch.setattr(api.usage_writer, "finish_open_usage", counted)
    futures = [writer.finish(_ended(m, i + 1), is_opened=True) for i, m in enumerate(meters)]
    writer.flush_finals()
    assert batches == [3]
    assert all(f.done() and f.exception() is None for f in futures)
    assert _rows(db_session_factory, tenant_id) == {
        m.request_id: ("ok", 5, i + 1) for i, m in enumerate(meters)
    }


def test_a_swept_row_and_a_row_never_opened_are_written_on_their_own_in_the_same_flush(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    writer = _writer(db_session_factory)
    live, swept = _opened(writer, tenant_id, 2)
    with db_session_factory() as session:  # as the lease sweep would have closed it
        session.execute(
            update(UsageRecord)
            .where(UsageRecord.request_id == swept.request_id)
            .values(status=INTERRUPTED_USAGE_STATUS)
        )
        session.commit()
    never_opened = RequestMeter(tenant_id=tenant_id, model_name="lorahost-base", num_prompt_tokens=5)
    futures = [
        writer.finish(_ended(live, 2), is_opened=True),
        writer.finish(_ended(swept, 3), is_opened=True),  # its true final values, not `interrupted`
        writer.finish(_ended(never_opened, 0, "rejected"), is_opened=False),  # inserted
    ]
    writer.flush_finals()
    assert all(f.exception() is None for f in futures)
    assert _rows(db_session_factory, tenant_id) == {
        live.request_id: ("ok", 5, 2),
        swept.request_id: ("ok", 5, 3),
        never_opened.request_id: ("rejected", 0, 0),
    }


def test_when_the_batch_fails_every_final_is_written_alone_and_a_bad_one_fails_alone(
    db_session_factory: sessionmaker[Session], tenant_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(db_session_factory)
    good, other = _opened(writer, tenant_id, 2)
    bad = RequestMeter(tenant_id="no-such-tenant", model_name="lorahost-base", num_prompt_tokens=5)

    def failing_batch(session: Session, rows: list[dict[str, Any]]) -> list[str]:
        raise RuntimeError("the batch's transaction failed")

    def failing_insert(session: Session, **values: Any) -> None:
        raise ValueError(f"cannot insert {values['request_id']}")

    monkeypatch.setattr(api.usage_writer, "finish_open_usage", failing_batch)
    monkeypatch.setattr(api.usage_writer, "record_usage", failing_insert)
    futures = [
        writer.finish(_ended(good, 1), is_opened=True),
        writer.finish(_ended(bad, 1), is_opened=False),
        writer.finish(_ended(other, 4), is_opened=True),
    ]
    writer.flush_finals()
    assert futures[0].exception() is None and futures[2].exception() is None
    assert isinstance(futures[1].exception(), ValueError)
    assert _rows(db_session_factory, tenant_id) == {
        good.request_id: ("ok", 5, 1),
        other.request_id: ("ok", 5, 4),
    }


def _cancel_waiting_for(future: Future[None]) -> None:
    """A request's task awaiting `future` (as UsageLedger does), cancelled while it waits (its client left)."""

    async def cancelled_wait() -> None:
        waiter = asyncio.ensure_future(asyncio.wrap_future(future))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.sleep(0)  # the cancellation's callbacks run

    asyncio.run(cancelled_wait())


def test_a_cancelled_wait_leaves_every_queued_write_of_its_batch_to_be_written_and_resolved(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    writer = _writer(db_session_factory)
    meters = [
        RequestMeter(tenant_id=tenant_id, model_name="lorahost-base", num_prompt_tokens=5) for _ in range(2)
    ]
    opens = [writer.open(m.open_values("api-finals")) for m in meters]
    _cancel_waiting_for(opens[0])
    writer.flush_opens()
    assert all(f.done() and f.exception() is None for f in opens)

    finals = [writer.finish(_ended(m, 2), is_opened=True) for m in meters]
    _cancel_waiting_for(finals[0])
    writer.flush_finals()
    assert all(f.done() and f.exception() is None for f in finals)
    assert _rows(db_session_factory, tenant_id) == {m.request_id: ("ok", 5, 2) for m in meters}
