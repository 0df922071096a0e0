"""Crash-safe usage rows on SQLite and PostgreSQL: open in_progress, checkpoint, renew leases, finish once, and
the three ways rows left open are closed as interrupted (the API's restart, a dead worker, an expired lease)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from registry import repository, usage
from registry.billing import billing_report
from registry.models import UsageRecord, new_id
from registry.usage import (
    OpenUsage,
    UsageLease,
    close_expired_usage,
    close_interrupted_usage,
    close_orphaned_usage,
    expired_lease_request_ids,
    finish_usage,
    load_usage_leases,
    orphaned_request_ids,
    renew_usage_leases,
)
from registry.usage_batches import checkpoint_usage, open_usage
from registry.usage_reports import load_rows, slo_report, usage_by_adapter_day

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _open(
    session: Session,
    tenant_id: str,
    owner: str = "api-1",
    worker_id: str | None = None,
    lease_renewed_at: datetime | None = None,
) -> str:
    request_id = f"req-{new_id()}"
    open_usage(
        session,
        [
            {
                "request_id": request_id,
                "tenant_id": tenant_id,
                "model_name": "m",
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "status": "in_progress",
                "api_instance_id": owner,
                "worker_id": worker_id,
                "started_at": T0,
                "lease_renewed_at": lease_renewed_at,
            }
        ],
    )
    return request_id


def _checkpoint(request_id: str, completion: int, at: datetime = T0, worker_id: str | None = "w-1") -> dict:
    return {
        "request_id": request_id,
        "prompt_tokens": 7,
        "completion_tokens": completion,
        "ttft_ms": 5.0,
        "tpot_ms": 1.0,
        "e2e_ms": 50.0,
        "worker_id": worker_id,
        "checkpointed_at": at,
    }


def _rows(session: Session, tenant_id: str) -> dict[str, UsageRecord]:
    session.expire_all()
    return {
        r.request_id: r
        for r in session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id))
    }


def _tenant(session: Session) -> str:
    return repository.create_tenant(session, f"t-{new_id()[:8]}").id


def test_checkpoints_update_open_rows_in_one_batch_and_a_final_update_keeps_one_row(
    db_session: Session,
) -> None:
    tenant = _tenant(db_session)
    first, second = _open(db_session, tenant), _open(db_session, tenant)
    checkpoint_usage(db_session, [_checkpoint(first, 10), _checkpoint(second, 3)])
    rows = _rows(db_session, tenant)
    assert (rows[first].status, rows[first].prompt_tokens, rows[first].completion_tokens) == (
        "in_progress",
        7,
        10,
    )
    assert rows[second].completion_tokens == 3 and rows[second].worker_id == "w-1"
    assert rows[first].checkpointed_at == T0

    assert finish_usage(
        db_session,
        {
            "request_id": first,
            "status": "ok",
            "prompt_tokens": 7,
            "completion_tokens": 12,
            "finished_at": T0 + timedelta(seconds=2),
        },
    )
    checkpoint_usage(db_session, [_checkpoint(first, 11)])  # late checkpoint: a closed row is left alone
    rows = _rows(db_session, tenant)
    assert len(rows) == 2
    assert (rows[first].status, rows[first].completion_tokens) == ("ok", 12)


def test_a_checkpoint_of_many_streams_writes_each_its_own_values_nulls_included(db_session: Session) -> None:
    tenant = _tenant(db_session)
    request_ids = [_open(db_session, tenant) for _ in range(40)]
    checkpoints = []
    for i, request_id in enumerate(request_ids):
        checkpoint = _checkpoint(
            request_id, i, T0 + timedelta(seconds=i), worker_id=None if i % 3 else f"w-{i}"
        )
        if i % 2:  # no token yet: no TTFT and no TPOT
            checkpoint |= {"ttft_ms": None, "tpot_ms": None}
        checkpoints.append(checkpoint)
    checkpoint_usage(db_session, checkpoints)
    rows = _rows(db_session, tenant)
    for i, request_id in enumerate(request_ids):
        row = rows[request_id]
        assert (row.status, row.completion_tokens, row.checkpointed_at) == (
            "in_progress", i, T0 + timedelta(seconds=i),
        )  # fmt: skip
        assert row.worker_id == (None if i % 3 else f"w-{i}")
        assert (row.ttft_ms, row.tpot_ms) == ((None, None) if i % 2 else (5.0, 1.0))


def test_a_checkpoint_with_no_latency_yet_and_whole_number_latencies_is_written(db_session: Session) -> None:
    # PostgreSQL sends each column as one typed array: a column of nothing but NULLs, and whole numbers (a spooled
    # checkpoint read back from JSON) in a float column, must still be written as given
    tenant = _tenant(db_session)
    first, second = _open(db_session, tenant), _open(db_session, tenant)
    checkpoint_usage(
        db_session,
        [
            _checkpoint(first, 0, worker_id=None) | {"ttft_ms": None, "tpot_ms": None, "e2e_ms": 40},
            _checkpoint(second, 0, worker_id=None) | {"ttft_ms": None, "tpot_ms": None, "e2e_ms": 41.5},
        ],
    )
    rows = _rows(db_session, tenant)
    assert [
        (rows[r].ttft_ms, rows[r].tpot_ms, rows[r].e2e_ms, rows[r].worker_id) for r in (first, second)
    ] == [
        (None, None, 40.0, None),
        (None, None, 41.5, None),
    ]


def test_finish_reports_a_missing_row_without_writing_one(db_session: Session) -> None:
    tenant = _tenant(db_session)
    assert not finish_usage(
        db_session, {"request_id": "req-never-opened", "status": "ok", "tenant_id": tenant}
    )
    assert _rows(db_session, tenant) == {}


def test_restart_closes_only_its_own_open_rows_as_interrupted_with_their_last_checkpoint(
    db_session: Session,
) -> None:
    tenant = _tenant(db_session)
    mine, never_checkpointed = _open(db_session, tenant, "api-1"), _open(db_session, tenant, "api-1")
    other_replica, finished = _open(db_session, tenant, "api-2"), _open(db_session, tenant, "api-1")
    checkpoint_usage(db_session, [_checkpoint(mine, 42, T0 + timedelta(seconds=3))])
    finish_usage(db_session, {"request_id": finished, "status": "ok", "completion_tokens": 5})

    assert close_interrupted_usage(db_session, "api-1") == 2
    rows = _rows(db_session, tenant)
    assert (rows[mine].status, rows[mine].prompt_tokens, rows[mine].completion_tokens) == (
        "interrupted",
        7,
        42,
    )
    assert rows[mine].finished_at == T0 + timedelta(seconds=3)  # the last moment it was known alive
    assert "last checkpoint" in (rows[mine].error_message or "")
    assert (rows[never_checkpointed].status, rows[never_checkpointed].completion_tokens) == ("interrupted", 0)
    assert rows[never_checkpointed].finished_at == T0
    assert rows[other_replica].status == "in_progress"  # another replica's rows are its own business
    assert rows[finished].status == "ok"
    assert close_interrupted_usage(db_session, "api-1") == 0


def test_a_final_update_overwrites_a_row_a_sweep_closed_too_early(db_session: Session) -> None:
    tenant = _tenant(db_session)
    request_id = _open(db_session, tenant, "api-1", worker_id="w-gone")
    close_orphaned_usage(db_session, set(), grace_s=0, now=T0 + timedelta(hours=1))
    assert _rows(db_session, tenant)[request_id].status == "interrupted"
    assert finish_usage(db_session, {"request_id": request_id, "status": "ok", "completion_tokens": 9})
    row = _rows(db_session, tenant)[request_id]
    assert (row.status, row.completion_tokens) == ("ok", 9)


def test_dead_worker_sweep_closes_rows_of_vanished_workers_after_the_grace(db_session: Session) -> None:
    tenant = _tenant(db_session)
    dead = _open(db_session, tenant, worker_id="w-dead")
    dead_recent = _open(db_session, tenant, worker_id="w-dead")
    live = _open(db_session, tenant, worker_id="w-live")
    unrouted = _open(db_session, tenant, worker_id=None)
    checkpoint_usage(
        db_session,
        [
            _checkpoint(dead, 20, T0, "w-dead"),
            _checkpoint(dead_recent, 4, T0 + timedelta(seconds=55), "w-dead"),
            _checkpoint(live, 8, T0, "w-live"),
        ],
    )
    closed = close_orphaned_usage(db_session, {"w-live"}, grace_s=10, now=T0 + timedelta(seconds=60))
    # the sweep is database-wide: open rows other tests committed (their workers are not live here) go too
    assert [r for r in closed if r in {dead, dead_recent, live, unrouted}] == [dead]
    rows = _rows(db_session, tenant)
    assert (rows[dead].status, rows[dead].completion_tokens) == ("interrupted", 20)
    assert "worker" in (rows[dead].error_message or "")
    assert {rows[r].status for r in (dead_recent, live, unrouted)} == {"in_progress"}


def test_orphan_decision_is_pure() -> None:
    rows = [
        OpenUsage("a", "w1", T0),
        OpenUsage("b", "w2", T0),
        OpenUsage("c", None, T0),
        OpenUsage("d", "w1", T0 + timedelta(seconds=9)),
    ]
    assert orphaned_request_ids(rows, {"w2"}, T0 + timedelta(seconds=10), grace_s=5) == ["a"]
    assert orphaned_request_ids(rows, set(), T0 + timedelta(seconds=10), grace_s=0) == ["a", "b", "d"]
    assert orphaned_request_ids(rows, {"w1", "w2"}, T0 + timedelta(days=1), grace_s=0) == []


def test_interrupted_tokens_are_billed_and_judged_failed_in_progress_ones_are_shown_not_judged(
    db_session: Session,
) -> None:
    tenant = _tenant(db_session)
    crashed, running = _open(db_session, tenant, "api-9"), _open(db_session, tenant, "api-8")
    checkpoint_usage(db_session, [_checkpoint(crashed, 30), _checkpoint(running, 4)])
    close_interrupted_usage(db_session, "api-9")
    lo, hi = T0 - timedelta(hours=1), T0 + timedelta(hours=1)

    line = next(line for line in billing_report(db_session, lo, hi) if line.tenant_id == tenant)
    assert (line.num_requests, line.prompt_tokens, line.completion_tokens) == (2, 14, 34)
    [day] = usage_by_adapter_day(load_rows(db_session, lo, hi, tenant))
    assert day["by_status"] == {"interrupted": 1, "in_progress": 1}
    [group] = [g for g in slo_report(db_session, lo, hi, "tenant") if g.key == tenant]
    assert (group.num_requests, group.num_interrupted, group.num_in_progress, group.num_ok) == (2, 1, 1, 0)
    assert group.error_rate == 1.0 and group.attainment == 0.0  # judged: only the interrupted one


LEASE_S = 30.0


def test_lease_renewal_moves_only_the_owners_open_rows_in_one_statement(db_session: Session) -> None:
    tenant = _tenant(db_session)
    streamed, non_streamed = _open(db_session, tenant, "api-1"), _open(db_session, tenant, "api-1")
    finished, other_owner = _open(db_session, tenant, "api-1"), _open(db_session, tenant, "api-2")
    checkpoint_usage(db_session, [_checkpoint(streamed, 10, T0 + timedelta(seconds=1))])
    finish_usage(db_session, {"request_id": finished, "status": "ok", "completion_tokens": 5})
    updates: list[str] = []
    connection = db_session.connection()

    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("UPDATE"):
            updates.append(statement)

    event.listen(connection, "before_cursor_execute", count)
    try:
        renewed_at = T0 + timedelta(seconds=5)
        assert renew_usage_leases(db_session, "api-1", renewed_at) == 2
    finally:
        event.remove(connection, "before_cursor_execute", count)
    assert len(updates) == 1
    rows = _rows(db_session, tenant)
    assert rows[streamed].lease_renewed_at == renewed_at and rows[non_streamed].lease_renewed_at == renewed_at
    assert rows[finished].lease_renewed_at is None and rows[other_owner].lease_renewed_at is None
    assert rows[streamed].checkpointed_at == T0 + timedelta(seconds=1)  # a renewal is not a token checkpoint
    assert (rows[streamed].completion_tokens, rows[finished].status) == (10, "ok")


def test_lease_renewal_leaves_rows_with_a_recent_sign_of_life_and_renews_the_rest(
    db_session: Session,
) -> None:
    tenant = _tenant(db_session)
    now, fresh_s = T0 + timedelta(seconds=60), 5.0
    checkpointed = _open(db_session, tenant, "api-1", lease_renewed_at=T0)
    renewed = _open(db_session, tenant, "api-1", lease_renewed_at=now - timedelta(seconds=fresh_s - 1))
    quiet_stream = _open(db_session, tenant, "api-1", lease_renewed_at=T0)
    quiet = _open(db_session, tenant, "api-1", lease_renewed_at=now - timedelta(seconds=fresh_s + 1))
    never_renewed = _open(db_session, tenant, "api-1")  # opened without a lease time (an older writer)
    checkpoint_usage(
        db_session,
        [
            _checkpoint(checkpointed, 10, now - timedelta(seconds=fresh_s - 1)),
            _checkpoint(quiet_stream, 3, now - timedelta(seconds=fresh_s + 1)),
        ],
    )

    assert renew_usage_leases(db_session, "api-1", now, fresh_s=fresh_s) == 3
    rows = _rows(db_session, tenant)
    assert {r for r, row in rows.items() if row.lease_renewed_at == now} == {
        quiet_stream,
        quiet,
        never_renewed,
    }
    assert rows[checkpointed].lease_renewed_at == T0  # its checkpoint is its sign of life: no write
    assert rows[renewed].lease_renewed_at == now - timedelta(seconds=fresh_s - 1)
    # every open row's latest sign of life is within fresh_s of the renewal: none is near its lease's end
    leases = {lease.request_id: lease.renewed_at for lease in load_usage_leases(db_session)}
    assert all(now - leases[r] < timedelta(seconds=fresh_s) for r in rows)


def test_the_sweep_closes_a_row_whose_owner_stopped_renewing_after_the_timeout_not_before(
    db_session: Session,
) -> None:
    tenant = _tenant(db_session)
    last_checkpoint, last_renewal = T0 + timedelta(seconds=2), T0 + timedelta(seconds=4)
    gone = _open(db_session, tenant, "api-pod-abc", worker_id="w-1", lease_renewed_at=T0)
    gone_unrouted = _open(db_session, tenant, "api-pod-abc", lease_renewed_at=T0)
    live = _open(db_session, tenant, "api-pod-def", lease_renewed_at=T0)
    checkpoint_usage(db_session, [_checkpoint(gone, 17, last_checkpoint)])
    renew_usage_leases(db_session, "api-pod-abc", last_renewal)  # its last renewal before it died

    just_before = last_renewal + timedelta(seconds=LEASE_S - 0.5)
    renew_usage_leases(db_session, "api-pod-def", just_before)
    assert close_expired_usage(db_session, LEASE_S, now=just_before) == 0
    assert {r.status for r in _rows(db_session, tenant).values()} == {"in_progress"}

    assert close_expired_usage(db_session, LEASE_S, now=last_renewal + timedelta(seconds=LEASE_S)) == 2
    rows = _rows(db_session, tenant)
    assert (rows[gone].status, rows[gone].prompt_tokens, rows[gone].completion_tokens) == (
        "interrupted",
        7,
        17,
    )
    assert rows[gone].finished_at == last_checkpoint  # billed as of its last checkpoint, not its last renewal
    assert "lease" in (rows[gone].error_message or "")
    assert (rows[gone_unrouted].status, rows[gone_unrouted].completion_tokens) == ("interrupted", 0)
    assert rows[live].status == "in_progress"  # renewed within the timeout
    assert close_expired_usage(db_session, LEASE_S, now=last_renewal + timedelta(seconds=LEASE_S)) == 0


def test_a_row_renewed_after_the_sweep_read_it_is_left_open(
    db_session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = _tenant(db_session)
    request_id = _open(db_session, tenant, "api-slow", lease_renewed_at=T0)
    now = T0 + timedelta(seconds=LEASE_S + 5)
    read_leases = usage.load_usage_leases

    def renew_between_read_and_close(session: Session) -> list[UsageLease]:
        leases = read_leases(session)
        renew_usage_leases(session, "api-slow", now)  # the owner renews, late, while the sweep runs
        return leases

    monkeypatch.setattr(usage, "load_usage_leases", renew_between_read_and_close)
    assert close_expired_usage(db_session, LEASE_S, now=now) == 0
    assert _rows(db_session, tenant)[request_id].status == "in_progress"


def test_the_final_write_after_a_premature_lease_close_records_the_true_outcome_once(
    db_session: Session,
) -> None:
    tenant = _tenant(db_session)
    request_id = _open(db_session, tenant, "api-slow", lease_renewed_at=T0)
    checkpoint_usage(db_session, [_checkpoint(request_id, 3, T0)])
    assert (
        close_expired_usage(db_session, LEASE_S, now=T0 + timedelta(hours=1)) == 1
    )  # renewals were too slow
    assert _rows(db_session, tenant)[request_id].status == "interrupted"

    final = {
        "request_id": request_id,
        "status": "ok",
        "prompt_tokens": 7,
        "completion_tokens": 40,
        "error_message": None,
        "finished_at": T0 + timedelta(seconds=50),
    }
    assert finish_usage(db_session, final)
    assert not finish_usage(db_session, {**final, "completion_tokens": 99})  # once: a finished row stays
    renew_usage_leases(db_session, "api-slow", T0 + timedelta(hours=2))
    assert close_expired_usage(db_session, LEASE_S, now=T0 + timedelta(hours=3)) == 0
    rows = _rows(db_session, tenant)
    assert len(rows) == 1
    row = rows[request_id]
    assert (row.status, row.prompt_tokens, row.completion_tokens, row.error_message) == ("ok", 7, 40, None)
    line = next(
        line
        for line in billing_report(db_session, T0 - timedelta(hours=1), T0 + timedelta(hours=1))
        if line.tenant_id == tenant
    )
    assert (line.num_requests, line.completion_tokens) == (1, 40)


def test_lease_decision_is_pure() -> None:
    leases = [
        UsageLease("a", T0),
        UsageLease("b", T0 + timedelta(seconds=5)),
        UsageLease("c", T0 - timedelta(days=1)),
    ]
    assert expired_lease_request_ids(leases, T0 + timedelta(seconds=30), 30.0) == ["a", "c"]
    assert expired_lease_request_ids(leases, T0 + timedelta(seconds=29.9), 30.0) == ["c"]
    assert expired_lease_request_ids(leases, T0 + timedelta(seconds=35), 30.0) == ["a", "b", "c"]
    naive = datetime(2026, 3, 1, 12, 0)  # naive = UTC (SQLite)
    assert expired_lease_request_ids([UsageLease("n", naive)], T0 + timedelta(seconds=30), 30.0) == ["n"]
