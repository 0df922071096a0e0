"""Usage-row leases on SQLite and PostgreSQL: an API instance renews its open rows in one statement, skips rows
with a recent sign of life, and the sweep closes a row whose owner stopped renewing as interrupted."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from registry import usage
from registry.billing import billing_report
from registry.usage import (
    UsageLease,
    close_expired_usage,
    expired_lease_request_ids,
    finish_usage,
    load_usage_leases,
    renew_usage_leases,
)
from registry.usage_batches import checkpoint_usage
from tests.registry.usage_rows import T0, checkpoint_row, new_tenant, open_row, usage_rows

LEASE_S = 30.0


def test_lease_renewal_moves_only_the_owners_open_rows_in_one_statement(db_session: Session) -> None:
    tenant = new_tenant(db_session)
    streamed, non_streamed = open_row(db_session, tenant, "api-1"), open_row(db_session, tenant, "api-1")
    finished, other_owner = open_row(db_session, tenant, "api-1"), open_row(db_session, tenant, "api-2")
    checkpoint_usage(db_session, [checkpoint_row(streamed, 10, T0 + timedelta(seconds=1))])
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
    rows = usage_rows(db_session, tenant)
    assert rows[streamed].lease_renewed_at == renewed_at and rows[non_streamed].lease_renewed_at == renewed_at
    assert rows[finished].lease_renewed_at is None and rows[other_owner].lease_renewed_at is None
    assert rows[streamed].checkpointed_at == T0 + timedelta(seconds=1)  # a renewal is not a token checkpoint
    assert (rows[streamed].completion_tokens, rows[finished].status) == (10, "ok")


def test_lease_renewal_leaves_rows_with_a_recent_sign_of_life_and_renews_the_rest(
    db_session: Session,
) -> None:
    tenant = new_tenant(db_session)
    now, fresh_s = T0 + timedelta(seconds=60), 5.0
    checkpointed = open_row(db_session, tenant, "api-1", lease_renewed_at=T0)
    renewed = open_row(db_session, tenant, "api-1", lease_renewed_at=now - timedelta(seconds=fresh_s - 1))
    quiet_stream = open_row(db_session, tenant, "api-1", lease_renewed_at=T0)
    quiet = open_row(db_session, tenant, "api-1", lease_renewed_at=now - timedelta(seconds=fresh_s + 1))
    never_renewed = open_row(db_session, tenant, "api-1")  # opened without a lease time (an older writer)
    checkpoint_usage(
        db_session,
        [
            checkpoint_row(checkpointed, 10, now - timedelta(seconds=fresh_s - 1)),
            checkpoint_row(quiet_stream, 3, now - timedelta(seconds=fresh_s + 1)),
        ],
    )

    assert renew_usage_leases(db_session, "api-1", now, fresh_s=fresh_s) == 3
    rows = usage_rows(db_session, tenant)
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
    tenant = new_tenant(db_session)
    last_checkpoint, last_renewal = T0 + timedelta(seconds=2), T0 + timedelta(seconds=4)
    gone = open_row(db_session, tenant, "api-pod-abc", worker_id="w-1", lease_renewed_at=T0)
    gone_unrouted = open_row(db_session, tenant, "api-pod-abc", lease_renewed_at=T0)
    live = open_row(db_session, tenant, "api-pod-def", lease_renewed_at=T0)
    checkpoint_usage(db_session, [checkpoint_row(gone, 17, last_checkpoint)])
    renew_usage_leases(db_session, "api-pod-abc", last_renewal)  # its last renewal before it died

    just_before = last_renewal + timedelta(seconds=LEASE_S - 0.5)
    renew_usage_leases(db_session, "api-pod-def", just_before)
    assert close_expired_usage(db_session, LEASE_S, now=just_before) == 0
    assert {r.status for r in usage_rows(db_session, tenant).values()} == {"in_progress"}

    assert close_expired_usage(db_session, LEASE_S, now=last_renewal + timedelta(seconds=LEASE_S)) == 2
    rows = usage_rows(db_session, tenant)
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
    tenant = new_tenant(db_session)
    request_id = open_row(db_session, tenant, "api-slow", lease_renewed_at=T0)
    now = T0 + timedelta(seconds=LEASE_S + 5)
    read_leases = usage.load_usage_leases

    def renew_between_read_and_close(session: Session) -> list[UsageLease]:
        leases = read_leases(session)
        renew_usage_leases(session, "api-slow", now)  # the owner renews, late, while the sweep runs
        return leases

    monkeypatch.setattr(usage, "load_usage_leases", renew_between_read_and_close)
    assert close_expired_usage(db_session, LEASE_S, now=now) == 0
    assert usage_rows(db_session, tenant)[request_id].status == "in_progress"


def test_the_final_write_after_a_premature_lease_close_records_the_true_outcome_once(
    db_session: Session,
) -> None:
    tenant = new_tenant(db_session)
    request_id = open_row(db_session, tenant, "api-slow", lease_renewed_at=T0)
    checkpoint_usage(db_session, [checkpoint_row(request_id, 3, T0)])
    assert (
        close_expired_usage(db_session, LEASE_S, now=T0 + timedelta(hours=1)) == 1
    )  # renewals were too slow
    assert usage_rows(db_session, tenant)[request_id].status == "interrupted"

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
    rows = usage_rows(db_session, tenant)
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
