"""Crash-safe metering in the API process: the in_progress row, stream checkpoints at a bounded rate, lease
renewals of every open row, and the final update of the same row (api/metering.py)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import partial

import anyio
import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from api.metering import UsageLedger
from api.ratelimit import InMemoryRateLimiter
from api.request_meter import RequestMeter
from api.usage_writer import UsageWriter
from registry import repository
from registry.db import make_engine, make_session_factory
from registry.models import UsageRecord, utcnow
from registry.usage import close_expired_usage

pytestmark = pytest.mark.slow  # the real ledger writer and its timers, over real seconds

FAR_S = 3600.0  # an interval that never elapses in a test: checkpoints are called explicitly


def _meter(tenant_id: str, num_prompt: int = 5) -> RequestMeter:
    meter = RequestMeter(tenant_id=tenant_id, model_name="lorahost-base", num_prompt_tokens=num_prompt)
    meter.worker_id = "w-1"
    return meter


def _rows(factory: sessionmaker[Session], tenant_id: str) -> list[UsageRecord]:
    with factory() as session:
        return list(session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id)))


@pytest.fixture
def tenant_id(db_session: Session) -> str:
    return repository.create_tenant(db_session, "metered").id


@pytest.mark.anyio
async def test_a_streamed_request_has_one_row_from_start_to_finish(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    ledger = UsageLedger(db_session_factory, api_instance_id="api-test", checkpoint_interval_s=FAR_S)
    meter = _meter(tenant_id)
    ledger.open(meter, is_checkpointed=True)
    await ledger.wait_opened(meter)
    [row] = _rows(db_session_factory, tenant_id)
    assert (row.status, row.prompt_tokens, row.completion_tokens, row.api_instance_id) == (
        "in_progress",
        0,
        0,
        "api-test",
    )

    meter.on_delivered(1)
    meter.on_delivered(1)
    assert ledger.writer.checkpoint() == 1
    [row] = _rows(db_session_factory, tenant_id)
    assert (row.status, row.prompt_tokens, row.completion_tokens, row.worker_id) == (
        "in_progress",
        5,
        2,
        "w-1",
    )
    assert row.ttft_ms is not None and row.checkpointed_at is not None
    assert ledger.writer.checkpoint() == 0  # nothing new delivered: no write

    meter.on_delivered(1)
    await ledger.record(meter, "ok")
    assert ledger.writer.checkpoint() == 0  # finished requests are no longer checkpointed
    [row] = _rows(db_session_factory, tenant_id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("ok", 5, 3)
    assert row.finished_at is not None and row.api_instance_id == "api-test"
    ledger.close()


@pytest.mark.anyio
async def test_a_non_streamed_request_is_not_billed_before_its_response_is_sent(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    ledger = UsageLedger(db_session_factory, api_instance_id="api-test", checkpoint_interval_s=FAR_S)
    meter = _meter(tenant_id)
    ledger.open(meter, is_checkpointed=False)
    await ledger.wait_opened(meter)
    meter.on_delivered(4)  # received from the worker for the response, not yet sent
    assert ledger.writer.checkpoint() == 0
    [row] = _rows(db_session_factory, tenant_id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("in_progress", 0, 0)
    await ledger.record(meter, "ok")
    [row] = _rows(db_session_factory, tenant_id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("ok", 5, 4)
    ledger.close()


@pytest.mark.anyio
async def test_a_request_whose_open_failed_is_still_recorded_once(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    ledger = UsageLedger(db_session_factory, api_instance_id="api-test", checkpoint_interval_s=FAR_S)
    meter = _meter(tenant_id)
    ledger.open(meter, is_checkpointed=True)
    await ledger.wait_opened(meter)
    with db_session_factory() as session:  # as if the insert had been lost
        session.query(UsageRecord).filter_by(request_id=meter.request_id).delete()
        session.commit()
    await ledger.record(meter, "rejected", "no worker")
    [row] = _rows(db_session_factory, tenant_id)
    assert row.status == "rejected"
    ledger.close()


def test_opens_queued_together_are_inserted_in_one_transaction(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    writer = UsageWriter(db_session_factory, FAR_S)
    writer._ensure_threads = lambda: None  # type: ignore[method-assign]  # flushed by hand below
    meters = [_meter(tenant_id) for _ in range(3)]
    futures = [writer.open(m.open_values("api-test"), m) for m in meters]
    commits: list[int] = []
    original = writer._insert
    writer._insert = lambda rows: (commits.append(len(rows)), original(rows))[1]  # type: ignore[method-assign]
    writer.flush_opens()
    assert commits == [3]
    assert all(f.done() and f.exception() is None for f in futures)
    assert len(_rows(db_session_factory, tenant_id)) == 3


@pytest.fixture
def file_engine(sqlite_url: str) -> Iterator[Engine]:
    """Its own engine on the migrated file SQLite: the writer thread gets connections of its own."""
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def test_a_row_opened_during_a_slow_checkpoint_round_is_inserted_without_waiting_for_it(
    file_engine: Engine,
) -> None:
    # a request's first token waits for its open row: the insert must not queue behind the periodic writes
    factory = make_session_factory(file_engine)
    with factory() as session:
        tenant_id = repository.create_tenant(session, "opener").id
        session.commit()
    writer = UsageWriter(factory, 0.01, api_instance_id="api-opener")
    in_round, release = threading.Event(), threading.Event()

    def slow_checkpoint() -> int:  # a checkpoint of thousands of streams, held here until released
        in_round.set()
        release.wait(timeout=60)
        return 0

    writer.checkpoint = slow_checkpoint  # type: ignore[method-assign]
    first = _meter(tenant_id)
    writer.open(first.open_values("api-opener"), first).result(timeout=30)  # starts the threads
    assert in_round.wait(timeout=30)
    second = _meter(tenant_id)
    writer.open(second.open_values("api-opener"), second).result(timeout=30)
    assert not release.is_set()  # inserted while the checkpointer's round still holds
    assert len(_rows(factory, tenant_id)) == 2
    release.set()
    writer.close()


def test_leases_are_renewed_every_renewal_interval_and_checkpoints_every_round(file_engine: Engine) -> None:
    factory = make_session_factory(file_engine)
    with factory() as session:
        tenant_id = repository.create_tenant(session, "renewals").id
        session.commit()
    clock = _Clock()
    writer = UsageWriter(factory, 0.25, clock, renewal_interval_s=1.0, api_instance_id="api-renewals")
    rounds: queue.Queue[bool] = queue.Queue()  # is_renewal_due of each round the checkpointer ran
    renewed: list[int] = []
    run_round, renew_leases = writer.run_round, writer.renew_leases

    def counted_round(*, is_renewal_due: bool) -> None:
        run_round(is_renewal_due=is_renewal_due)
        rounds.put(is_renewal_due)

    writer.run_round = counted_round  # type: ignore[method-assign]
    writer.renew_leases = lambda: renewed.append(renew_leases()) or renewed[-1]  # type: ignore[method-assign]
    meter = _meter(tenant_id)
    writer.open(meter.open_values("api-renewals")).result(timeout=30)  # starts the threads at clock.now
    due = []
    for _ in range(8):
        clock.now += 0.25  # one checkpoint interval
        due.append(rounds.get(timeout=30))
    writer.close()
    assert due == [False, False, False, True] * 2  # renewals every fourth round (1 s of a 0.25 s interval)
    assert renewed == [1, 1]  # each renewed the one open row


def test_streams_are_checkpointed_at_most_once_per_interval(file_engine: Engine) -> None:
    factory = make_session_factory(file_engine)
    with factory() as session:
        tenant_id = repository.create_tenant(session, "rate").id
        session.commit()
    statements: list[int] = []  # rows per checkpoint UPDATE
    lock = threading.Lock()

    @event.listens_for(file_engine, "before_cursor_execute")
    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        is_checkpoint = (
            "checkpointed_at" in statement and "lease_renewed_at" not in statement
        )  # not a renewal
        if statement.startswith("UPDATE usage_records") and is_checkpoint:
            with lock:
                statements.append(len(parameters) if executemany else 1)

    interval_s = 0.2
    ledger = UsageLedger(factory, api_instance_id="api-rate", checkpoint_interval_s=interval_s)
    meters = [_meter(tenant_id) for _ in range(3)]
    for meter in meters:
        ledger.open(meter, is_checkpointed=True)
        meter.opened.result(timeout=30)  # type: ignore[union-attr]
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        for meter in meters:
            meter.on_delivered(1)  # a token every few ms on every stream
        time.sleep(0.005)
    elapsed_s = time.monotonic() - started
    delivered = meters[0].num_delivered_tokens
    deadline = time.monotonic() + 30  # liveness, bounded: the last count reaches the DB
    while {r.completion_tokens for r in _rows(factory, tenant_id)} != {
        delivered
    } and time.monotonic() < deadline:
        time.sleep(0.05)
    elapsed_s = time.monotonic() - started
    ledger.close()
    assert {r.completion_tokens for r in _rows(factory, tenant_id)} == {delivered}
    max_rounds = int(elapsed_s / interval_s) + 1
    assert 1 <= len(statements) <= max_rounds  # one UPDATE statement per interval at most ...
    assert set(statements) == {3}  # ... carrying every stream that changed, in one transaction
    event.remove(file_engine, "before_cursor_execute", count)


@pytest.mark.anyio
async def test_the_writer_renews_the_leases_of_every_open_row_streamed_or_not_until_it_is_finished(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    ledger = UsageLedger(db_session_factory, api_instance_id="api-lease", checkpoint_interval_s=FAR_S)
    streamed, non_streamed = _meter(tenant_id), _meter(tenant_id)
    ledger.open(streamed, is_checkpointed=True)
    ledger.open(non_streamed, is_checkpointed=False)
    for meter in (streamed, non_streamed):
        await ledger.wait_opened(meter)
    assert all(
        r.lease_renewed_at is not None for r in _rows(db_session_factory, tenant_id)
    )  # leased from the start
    assert ledger.writer.renew_leases() == 0  # just opened: a sign of life within half an interval, no write

    with db_session_factory() as session:  # their last sign of life one renewal interval ago
        for row in session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id)):
            row.lease_renewed_at -= timedelta(seconds=FAR_S)  # type: ignore[operator]
        session.commit()
    opened_at = {r.request_id: r.lease_renewed_at for r in _rows(db_session_factory, tenant_id)}
    assert ledger.writer.renew_leases() == 2
    renewed = {r.request_id: r.lease_renewed_at for r in _rows(db_session_factory, tenant_id)}
    assert all(renewed[rid] > opened_at[rid] for rid in renewed)  # type: ignore[operator]

    await ledger.record(streamed, "ok")
    await ledger.record(non_streamed, "ok")
    assert ledger.writer.renew_leases() == 0  # nothing held open: no statement at all
    assert {r.status for r in _rows(db_session_factory, tenant_id)} == {"ok"}
    ledger.close()


@pytest.mark.anyio
async def test_a_request_held_through_a_long_cold_start_is_not_overdue_when_its_row_opens(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    ledger = UsageLedger(db_session_factory, api_instance_id="api-cold", checkpoint_interval_s=FAR_S)
    meter = _meter(tenant_id)
    meter.started_at = utcnow() - timedelta(minutes=2)  # arrived two minutes ago, admitted only now
    ledger.open(meter, is_checkpointed=False)
    await ledger.wait_opened(meter)
    with db_session_factory() as session:
        close_expired_usage(session, 30.0)
    [row] = _rows(db_session_factory, tenant_id)
    assert row.status == "in_progress"
    await ledger.record(meter, "ok")
    ledger.close()


@pytest.mark.anyio
async def test_a_live_apis_long_non_streamed_request_is_never_closed_by_the_lease_sweep(
    file_engine: Engine,
) -> None:
    factory = make_session_factory(file_engine)
    with factory() as session:
        tenant_id = repository.create_tenant(session, "lease").id
        session.commit()
    renewals: list[int] = []  # rows per lease-renewal UPDATE
    lock = threading.Lock()

    @event.listens_for(file_engine, "before_cursor_execute")
    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.startswith("UPDATE usage_records") and "lease_renewed_at" in statement:
            with lock:
                renewals.append(len(parameters) if executemany else 1)

    interval_s, lease_timeout_s = 0.1, 1.5
    ledger = UsageLedger(factory, api_instance_id="api-live", checkpoint_interval_s=interval_s)
    meter = _meter(tenant_id)
    ledger.open(meter, is_checkpointed=False)  # non-streamed: never checkpointed, only renewed
    meter.opened.result(timeout=30)  # type: ignore[union-attr]
    started = time.monotonic()
    num_sweeps = 0
    while time.monotonic() - started < 2 * lease_timeout_s:  # runs past the timeout from its start
        with factory() as session:  # the sweep sees the whole (shared) database; only our row matters here
            close_expired_usage(session, lease_timeout_s)
        num_sweeps += 1
        [row] = _rows(factory, tenant_id)
        assert row.status == "in_progress", row.error_message
        await anyio.sleep(interval_s / 2)
    elapsed_s = time.monotonic() - started
    meter.on_delivered(25)  # the response arrives
    await ledger.record(meter, "ok")
    ledger.close()
    event.remove(file_engine, "before_cursor_execute", count)

    [row] = _rows(factory, tenant_id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("ok", 5, 25)
    assert row.checkpointed_at is None  # renewals are not token checkpoints
    assert num_sweeps > 10
    assert 1 <= len(renewals) <= int(elapsed_s / interval_s) + 2  # one UPDATE per interval at most ...
    assert set(renewals) == {1}  # ... each a single statement


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.anyio
async def test_the_writer_renews_the_concurrency_slots_of_the_requests_it_holds_open_until_they_are_recorded(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    clock = _Clock()
    limiter = InMemoryRateLimiter(clock, slot_lease_s=30.0)
    ledger = UsageLedger(
        db_session_factory,
        api_instance_id="api-slots",
        checkpoint_interval_s=FAR_S,
        renew_slots=limiter.renew_slots,
    )
    capped, uncapped = _meter(tenant_id), _meter(tenant_id)
    assert limiter.acquire_slot(tenant_id, capped.request_id, 1).is_allowed  # as admit() does
    capped.release_slot = partial(limiter.release_slot_async, tenant_id, capped.request_id)
    ledger.open(capped, is_checkpointed=True)
    ledger.open(uncapped, is_checkpointed=False)  # holds no slot: nothing to renew
    for _ in range(4):  # two leases' worth of time, renewed every checkpoint round
        clock.now += 15.0
        assert ledger.writer.renew_slots() == 1
    assert limiter.num_held_slots(tenant_id) == 1  # still held: its request is running
    assert not limiter.acquire_slot(tenant_id, "next", 1).is_allowed

    await ledger.record(capped, "ok")
    assert ledger.writer.renew_slots() == 0  # released and no longer renewed
    assert limiter.num_held_slots(tenant_id) == 0
    assert limiter.acquire_slot(tenant_id, "next", 1).is_allowed
    await ledger.record(uncapped, "ok")
    ledger.close()


def test_the_slot_renewal_runs_in_the_writer_round_even_when_the_usage_update_fails(
    db_session_factory: sessionmaker[Session], tenant_id: str
) -> None:
    renewed: list[list[tuple[str, str]]] = []
    clock = _Clock()
    writer = UsageWriter(
        db_session_factory, FAR_S, clock, api_instance_id="api-down", renew_slots=renewed.append
    )
    writer.renew_leases = _fail  # type: ignore[method-assign]  # the database is down
    meter = _meter(tenant_id)
    writer.open(meter.open_values("api-down"), holds_slot=True)
    writer.run_round(is_renewal_due=True)  # one round of the checkpointer thread, run synchronously
    assert renewed == [[(tenant_id, meter.request_id)]]
    writer.close()


def _fail() -> int:
    raise RuntimeError("database is down")
