"""Crash-safe usage rows on SQLite and PostgreSQL: open in_progress, checkpoint, finish once, and the two
sweeps that close rows left open (the API's restart, a dead worker) as interrupted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import repository
from registry.models import UsageRecord, new_id
from registry.usage import (
    OpenUsage,
    billing_report,
    checkpoint_usage,
    close_interrupted_usage,
    close_orphaned_usage,
    finish_usage,
    load_rows,
    open_usage,
    orphaned_request_ids,
    slo_report,
    usage_by_adapter_day,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _open(session: Session, tenant_id: str, owner: str = "api-1", worker_id: str | None = None) -> str:
    request_id = f"req-{new_id()}"
    open_usage(session, [{
        "request_id": request_id, "tenant_id": tenant_id, "model_name": "m", "prompt_tokens": 0,
        "completion_tokens": 0, "status": "in_progress", "api_instance_id": owner, "worker_id": worker_id,
        "started_at": T0,
    }])
    return request_id


def _checkpoint(request_id: str, completion: int, at: datetime = T0, worker_id: str | None = "w-1") -> dict:
    return {"request_id": request_id, "prompt_tokens": 7, "completion_tokens": completion, "ttft_ms": 5.0,
            "tpot_ms": 1.0, "e2e_ms": 50.0, "worker_id": worker_id, "checkpointed_at": at}


def _rows(session: Session, tenant_id: str) -> dict[str, UsageRecord]:
    session.expire_all()
    return {r.request_id: r for r in session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id))}


def _tenant(session: Session) -> str:
    return repository.create_tenant(session, f"t-{new_id()[:8]}").id


def test_checkpoints_update_open_rows_in_one_batch_and_a_final_update_keeps_one_row(db_session: Session) -> None:
    tenant = _tenant(db_session)
    first, second = _open(db_session, tenant), _open(db_session, tenant)
    checkpoint_usage(db_session, [_checkpoint(first, 10), _checkpoint(second, 3)])
    rows = _rows(db_session, tenant)
    assert (rows[first].status, rows[first].prompt_tokens, rows[first].completion_tokens) == ("in_progress", 7, 10)
    assert rows[second].completion_tokens == 3 and rows[second].worker_id == "w-1"
    assert rows[first].checkpointed_at == T0

    assert finish_usage(db_session, {"request_id": first, "status": "ok", "prompt_tokens": 7, "completion_tokens": 12,
                                     "finished_at": T0 + timedelta(seconds=2)})
    checkpoint_usage(db_session, [_checkpoint(first, 11)])  # late checkpoint: a closed row is left alone
    rows = _rows(db_session, tenant)
    assert len(rows) == 2
    assert (rows[first].status, rows[first].completion_tokens) == ("ok", 12)


def test_finish_reports_a_missing_row_without_writing_one(db_session: Session) -> None:
    tenant = _tenant(db_session)
    assert not finish_usage(db_session, {"request_id": "req-never-opened", "status": "ok", "tenant_id": tenant})
    assert _rows(db_session, tenant) == {}


def test_restart_closes_only_its_own_open_rows_as_interrupted_with_their_last_checkpoint(db_session: Session) -> None:
    tenant = _tenant(db_session)
    mine, never_checkpointed = _open(db_session, tenant, "api-1"), _open(db_session, tenant, "api-1")
    other_replica, finished = _open(db_session, tenant, "api-2"), _open(db_session, tenant, "api-1")
    checkpoint_usage(db_session, [_checkpoint(mine, 42, T0 + timedelta(seconds=3))])
    finish_usage(db_session, {"request_id": finished, "status": "ok", "completion_tokens": 5})

    assert close_interrupted_usage(db_session, "api-1") == 2
    rows = _rows(db_session, tenant)
    assert (rows[mine].status, rows[mine].prompt_tokens, rows[mine].completion_tokens) == ("interrupted", 7, 42)
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
    checkpoint_usage(db_session, [
        _checkpoint(dead, 20, T0, "w-dead"), _checkpoint(dead_recent, 4, T0 + timedelta(seconds=55), "w-dead"),
        _checkpoint(live, 8, T0, "w-live"),
    ])
    closed = close_orphaned_usage(db_session, {"w-live"}, grace_s=10, now=T0 + timedelta(seconds=60))
    assert closed == [dead]
    rows = _rows(db_session, tenant)
    assert (rows[dead].status, rows[dead].completion_tokens) == ("interrupted", 20)
    assert "worker" in (rows[dead].error_message or "")
    assert {rows[r].status for r in (dead_recent, live, unrouted)} == {"in_progress"}


def test_orphan_decision_is_pure() -> None:
    rows = [
        OpenUsage("a", "w1", T0), OpenUsage("b", "w2", T0), OpenUsage("c", None, T0),
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
