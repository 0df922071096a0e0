"""Crash-safe usage rows on SQLite and PostgreSQL: open in_progress, checkpoint, finish once, and the ways rows
left open are closed as interrupted (the API's restart, a dead worker); leases are in test_usage_leases.py."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session

from registry.billing import billing_report
from registry.usage import (
    OpenUsage,
    close_interrupted_usage,
    close_orphaned_usage,
    finish_usage,
    orphaned_request_ids,
)
from registry.usage_batches import checkpoint_usage
from registry.usage_reports import load_rows, slo_report, usage_by_adapter_day
from tests.registry.usage_rows import T0, checkpoint_row, new_tenant, open_row, usage_rows


def test_checkpoints_update_open_rows_in_one_batch_and_a_final_update_keeps_one_row(
    db_session: Session,
) -> None:
    tenant = new_tenant(db_session)
    first, second = open_row(db_session, tenant), open_row(db_session, tenant)
    checkpoint_usage(db_session, [checkpoint_row(first, 10), checkpoint_row(second, 3)])
    rows = usage_rows(db_session, tenant)
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
    checkpoint_usage(db_session, [checkpoint_row(first, 11)])  # late checkpoint: a closed row is left alone
    rows = usage_rows(db_session, tenant)
    assert len(rows) == 2
    assert (rows[first].status, rows[first].completion_tokens) == ("ok", 12)


def test_a_checkpoint_of_many_streams_writes_each_its_own_values_nulls_included(db_session: Session) -> None:
    tenant = new_tenant(db_session)
    request_ids = [open_row(db_session, tenant) for _ in range(40)]
    checkpoints = []
    for i, request_id in enumerate(request_ids):
        checkpoint = checkpoint_row(
            request_id, i, T0 + timedelta(seconds=i), worker_id=None if i % 3 else f"w-{i}"
        )
        if i % 2:  # no token yet: no TTFT and no TPOT
            checkpoint |= {"ttft_ms": None, "tpot_ms": None}
        checkpoints.append(checkpoint)
    checkpoint_usage(db_session, checkpoints)
    rows = usage_rows(db_session, tenant)
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
    tenant = new_tenant(db_session)
    first, second = open_row(db_session, tenant), open_row(db_session, tenant)
    checkpoint_usage(
        db_session,
        [
            checkpoint_row(first, 0, worker_id=None) | {"ttft_ms": None, "tpot_ms": None, "e2e_ms": 40},
            checkpoint_row(second, 0, worker_id=None) | {"ttft_ms": None, "tpot_ms": None, "e2e_ms": 41.5},
        ],
    )
    rows = usage_rows(db_session, tenant)
    assert [
        (rows[r].ttft_ms, rows[r].tpot_ms, rows[r].e2e_ms, rows[r].worker_id) for r in (first, second)
    ] == [
        (None, None, 40.0, None),
        (None, None, 41.5, None),
    ]


def test_finish_reports_a_missing_row_without_writing_one(db_session: Session) -> None:
    tenant = new_tenant(db_session)
    assert not finish_usage(
        db_session, {"request_id": "req-never-opened", "status": "ok", "tenant_id": tenant}
    )
    assert usage_rows(db_session, tenant) == {}


def test_restart_closes_only_its_own_open_rows_as_interrupted_with_their_last_checkpoint(
    db_session: Session,
) -> None:
    tenant = new_tenant(db_session)
    mine, never_checkpointed = open_row(db_session, tenant, "api-1"), open_row(db_session, tenant, "api-1")
    other_replica, finished = open_row(db_session, tenant, "api-2"), open_row(db_session, tenant, "api-1")
    checkpoint_usage(db_session, [checkpoint_row(mine, 42, T0 + timedelta(seconds=3))])
    finish_usage(db_session, {"request_id": finished, "status": "ok", "completion_tokens": 5})

    assert close_interrupted_usage(db_session, "api-1") == 2
    rows = usage_rows(db_session, tenant)
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
    tenant = new_tenant(db_session)
    request_id = open_row(db_session, tenant, "api-1", worker_id="w-gone")
    close_orphaned_usage(db_session, set(), grace_s=0, now=T0 + timedelta(hours=1))
    assert usage_rows(db_session, tenant)[request_id].status == "interrupted"
    assert finish_usage(db_session, {"request_id": request_id, "status": "ok", "completion_tokens": 9})
    row = usage_rows(db_session, tenant)[request_id]
    assert (row.status, row.completion_tokens) == ("ok", 9)


def test_dead_worker_sweep_closes_rows_of_vanished_workers_after_the_grace(db_session: Session) -> None:
    tenant = new_tenant(db_session)
    dead = open_row(db_session, tenant, worker_id="w-dead")
    dead_recent = open_row(db_session, tenant, worker_id="w-dead")
    live = open_row(db_session, tenant, worker_id="w-live")
    unrouted = open_row(db_session, tenant, worker_id=None)
    checkpoint_usage(
        db_session,
        [
            checkpoint_row(dead, 20, T0, "w-dead"),
            checkpoint_row(dead_recent, 4, T0 + timedelta(seconds=55), "w-dead"),
            checkpoint_row(live, 8, T0, "w-live"),
        ],
    )
    closed = close_orphaned_usage(db_session, {"w-live"}, grace_s=10, now=T0 + timedelta(seconds=60))
    # the sweep is database-wide: open rows other tests committed (their workers are not live here) go too
    assert [r for r in closed if r in {dead, dead_recent, live, unrouted}] == [dead]
    rows = usage_rows(db_session, tenant)
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
    tenant = new_tenant(db_session)
    crashed, running = open_row(db_session, tenant, "api-9"), open_row(db_session, tenant, "api-8")
    checkpoint_usage(db_session, [checkpoint_row(crashed, 30), checkpoint_row(running, 4)])
    close_interrupted_usage(db_session, "api-9")
    lo, hi = T0 - timedelta(hours=1), T0 + timedelta(hours=1)

    line = next(line for line in billing_report(db_session, lo, hi) if line.tenant_id == tenant)
    assert (line.num_requests, line.prompt_tokens, line.completion_tokens) == (2, 14, 34)
    [day] = usage_by_adapter_day(load_rows(db_session, lo, hi, tenant))
    assert day["by_status"] == {"interrupted": 1, "in_progress": 1}
    [group] = [g for g in slo_report(db_session, lo, hi, "tenant") if g.key == tenant]
    assert (group.num_requests, group.num_interrupted, group.num_in_progress, group.num_ok) == (2, 1, 1, 0)
    assert group.error_rate == 1.0 and group.attainment == 0.0  # judged: only the interrupted one
