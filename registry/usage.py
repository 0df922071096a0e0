"""The usage ledger: one UsageRecord per request, written through its lifecycle (billing and SLO
aggregation over these rows: registry/usage_reports.py; the usage writer's batched writes of open rows:
registry/usage_batches.py).

Row lifecycle (crash-safe metering, see api/metering.py): a request's row is inserted `in_progress` when it
starts, checkpointed (tokens delivered so far) while it streams and updated once to its final status. While it is
open its owner (the API process, api_instance_id) renews its lease (`lease_renewed_at`) every quarter of the
lease (settings.metering.renewal_interval_s), streamed or not, with one UPDATE for all its open rows that show no
recent sign of life (a checkpoint is one: renew_usage_leases). A row left `in_progress` is closed
`interrupted` with its last checkpoint by whichever comes first:
- its owner starting again under the same api_instance_id (close_interrupted_usage, before it serves);
- the periodic usage sweep, when its worker left the worker directory (close_orphaned_usage);
- the same sweep, when its latest sign of life (start, lease renewal, checkpoint) is older than
  settings.metering.lease_timeout_s (close_expired_usage): the
  owner died and came back under another id (a Kubernetes pod's random name) or never came back (scaled
  down). Lease ages compare the owner's clock with the sweeper's: hosts' clocks must agree to well within
  the timeout (NTP).
A final update may still overwrite an `interrupted` row (the API outlived its worker's heartbeat, or only
renewed late, and knows better); it never creates a second row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal, cast

from sqlalchemy import (
    CursorResult,
    Select,
    Table,
    Update,
    bindparam,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from registry.models import (
    INTERRUPTED_USAGE_STATUS,
    OPEN_USAGE_STATUS,
    UsageRecord,
    utcnow,
)
from registry.usage_rollup import unroll_days_of

GroupBy = Literal["tenant", "adapter", "hour"]
GROUP_BYS: tuple[str, ...] = ("tenant", "adapter", "base_model", "hour")
JUDGED_STATUSES = ("ok", "error", INTERRUPTED_USAGE_STATUS)
FAILED_STATUSES = ("error", INTERRUPTED_USAGE_STATUS)
INTERRUPTED_BY_RESTART = (
    "the API process stopped (crash or kill) before the request ended; billed to its last checkpoint"
)
INTERRUPTED_BY_WORKER = (
    "the worker left the worker directory before the request ended; billed to its last checkpoint"
)
INTERRUPTED_BY_LEASE = (
    "the API process serving the request stopped renewing its usage lease (crash or kill, scale-down, or a restart "
    "under another api_instance_id) before the request ended; billed to its last checkpoint"
)
CENT = Decimal("0.000001")


class DuplicateUsageError(ValueError):
    """A usage record for this request id exists already (a request is metered exactly once)."""


def record_usage(session: Session, **values: object) -> UsageRecord:
    """Insert one request's usage row and commit; raises DuplicateUsageError if request_id was metered."""
    unroll_days_of(session, [cast(datetime | None, values.get("started_at"))])
    record = UsageRecord(**values)
    session.add(record)
    try:
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        raise DuplicateUsageError(f"request {values.get('request_id')!r} is already metered") from exc
    return record


def in_lock_order(condition: Any) -> Select[str]:
    """The ids of the usage rows matching `condition`, locked in request_id order (FOR UPDATE: the locks last
    until the transaction ends; SQLite, which locks the whole database on a write, ignores it). Run it, or use
    it as the subquery of an UPDATE (`UsageRecord.id.in_(...)`: the UPDATE then changes only rows it locked).

    Every write that changes several rows in one transaction and waits for their locks (a finisher's batch, a
    checkpoint, a sweep) takes its rows' locks this way first, in this one order, so two of them never wait on each other
    in a circle: PostgreSQL found such a deadlock after `deadlock_timeout` (1 s, both writers stalled) and
    aborted one, 1-2 times in a run of 2,000 streams (benchmarks/RESULTS.md, the thirteenth pass).
    """
    return select(UsageRecord.id).where(condition).order_by(UsageRecord.request_id).with_for_update()


_FINISH_STATEMENTS: dict[tuple[tuple[str, ...], str], Update] = {}


def finish_statement(fields: tuple[str, ...], status: str) -> Update:
    """A Core UPDATE of `fields` for one row in `status`, built once per field set (it runs once per request:
    an ORM update built per call costs ~1 ms of CPU more)."""
    statement = _FINISH_STATEMENTS.get((fields, status))
    if statement is None:
        statement = (
            update(cast(Table, UsageRecord.__table__))
            .where(UsageRecord.request_id == bindparam("b_request_id"), UsageRecord.status == status)
            .values({name: bindparam(f"b_{name}") for name in fields})
        )
        _FINISH_STATEMENTS[(fields, status)] = statement
    return statement


def finish_usage(session: Session, values: dict[str, object]) -> bool:
    """Give an open (or swept) row its final values; False, changing nothing, when no such row exists.

    A swept row (`interrupted`) may lie in a day the daily rollup already summed: its update un-rolls that day
    in the same transaction, under the rollup lock (registry/usage_rollup.py).
    """
    fields = tuple(sorted(k for k in values if k != "request_id"))
    params = {f"b_{name}": value for name, value in values.items()}
    result = cast(
        CursorResult[Any], session.connection().execute(finish_statement(fields, OPEN_USAGE_STATUS), params)
    )
    if result.rowcount:
        session.commit()
        return True
    started_at = session.scalar(
        select(UsageRecord.started_at).where(
            UsageRecord.request_id == values["request_id"], UsageRecord.status == INTERRUPTED_USAGE_STATUS
        )
    )
    if started_at is None:
        session.rollback()
        return False
    unroll_days_of(session, [started_at])  # first: it takes the rollup lock when the row's day may be rolled
    result = cast(
        CursorResult[Any],
        session.connection().execute(finish_statement(fields, INTERRUPTED_USAGE_STATUS), params),
    )
    session.commit()
    return bool(result.rowcount)


def _execute_dml(session: Session, statement: Update) -> CursorResult[Any]:
    return cast(CursorResult[Any], session.execute(statement))


def _interrupt(session: Session, condition: Any, message: str) -> int:
    result = _execute_dml(
        session,
        update(UsageRecord)
        .where(
            UsageRecord.id.in_(in_lock_order((UsageRecord.status == OPEN_USAGE_STATUS) & condition)),
            UsageRecord.status == OPEN_USAGE_STATUS,
        )
        .values(
            status=INTERRUPTED_USAGE_STATUS,
            error_message=message,
            finished_at=func.coalesce(UsageRecord.checkpointed_at, UsageRecord.started_at),
        )
        .execution_options(synchronize_session=False),
    )
    session.commit()
    return int(result.rowcount or 0)


def close_interrupted_usage(session: Session, api_instance_id: str) -> int:
    """Close the rows a previous API process with this owner id left open as `interrupted`, keeping their last
    checkpoint; returns how many. Call it when that API process starts, before it serves."""
    return _interrupt(session, UsageRecord.api_instance_id == api_instance_id, INTERRUPTED_BY_RESTART)


@dataclass(frozen=True)
class OpenUsage:
    """An open usage row as the dead-worker sweep sees it (plain data)."""

    request_id: str
    worker_id: str | None
    last_seen_at: datetime


def orphaned_request_ids(
    rows: Iterable[OpenUsage], live_worker_ids: set[str], now: datetime, grace_s: float
) -> list[str]:
    """Open rows routed to a worker that is not live and not checkpointed for grace_s: their worker died.

    Rows not yet routed (worker_id None) belong to their API process alone (it closes them on restart).
    """
    return sorted(
        r.request_id
        for r in rows
        if r.worker_id is not None
        and r.worker_id not in live_worker_ids
        and (as_utc(now) - as_utc(r.last_seen_at)).total_seconds() >= grace_s
    )


def load_open_usage(session: Session) -> list[OpenUsage]:
    """Every open row that was routed to a worker."""
    query = select(
        UsageRecord.request_id, UsageRecord.worker_id, UsageRecord.checkpointed_at, UsageRecord.started_at
    )
    query = query.where(UsageRecord.status == OPEN_USAGE_STATUS, UsageRecord.worker_id.is_not(None))
    return [
        OpenUsage(rid, wid, as_utc(seen or started)) for rid, wid, seen, started in session.execute(query)
    ]


def close_orphaned_usage(
    session: Session, live_worker_ids: set[str], grace_s: float, now: datetime | None = None
) -> list[str]:
    """Close the open rows of workers that left the directory as `interrupted`; returns their request ids."""
    request_ids = orphaned_request_ids(load_open_usage(session), live_worker_ids, now or utcnow(), grace_s)
    if request_ids:
        _interrupt(session, UsageRecord.request_id.in_(request_ids), INTERRUPTED_BY_WORKER)
    return request_ids


def renew_usage_leases(
    session: Session, api_instance_id: str, now: datetime | None = None, *, fresh_s: float = 0.0
) -> int:
    """Renew the lease of the rows this owner holds open, with one UPDATE, and commit; returns how many.

    Call it once per renewal interval while the owner process has requests running (api/metering.py). A row
    whose lease was renewed or which was checkpointed less than `fresh_s` ago is left alone: the usage sweep
    counts a checkpoint as a sign of life too (latest_sign_of_life), so a stream checkpointed every second needs
    no renewal (the API's writer passes half its renewal interval). A row another transaction holds locked is skipped, not waited for (FOR UPDATE SKIP
    LOCKED): a final is closing it, or a checkpoint is giving it a newer sign; the next renewal takes it if it
    is still open. So a renewal never waits and holds no lock while it waits: it is in no lock order
    (in_lock_order), and a final never waits behind the renewal of every open row (160-260 ms at 1,000 rows
    per process: benchmarks/RESULTS.md, the twenty-first pass).
    """
    now = now or utcnow()
    cutoff = now - timedelta(seconds=fresh_s)
    is_stale = (
        (UsageRecord.api_instance_id == api_instance_id)
        & (UsageRecord.status == OPEN_USAGE_STATUS)
        & or_(UsageRecord.lease_renewed_at.is_(None), UsageRecord.lease_renewed_at < cutoff)
        & or_(UsageRecord.checkpointed_at.is_(None), UsageRecord.checkpointed_at < cutoff)
    )
    unlocked = select(UsageRecord.id).where(is_stale).with_for_update(skip_locked=True)
    result = _execute_dml(
        session,
        update(UsageRecord)
        .where(UsageRecord.id.in_(unlocked), is_stale)
        .values(lease_renewed_at=now)
        .execution_options(synchronize_session=False),
    )
    session.commit()
    return int(result.rowcount or 0)


@dataclass(frozen=True)
class UsageLease:
    """An open usage row as the lease sweep sees it (plain data)."""

    request_id: str
    renewed_at: datetime  # the latest sign of its owner's life: lease renewal, checkpoint or start


def expired_lease_request_ids(leases: Iterable[UsageLease], now: datetime, timeout_s: float) -> list[str]:
    """Open rows whose owner has not renewed their lease (nor checkpointed them) for timeout_s: it is gone."""
    return sorted(
        lease.request_id
        for lease in leases
        if (as_utc(now) - as_utc(lease.renewed_at)).total_seconds() >= timeout_s
    )


def latest_sign_of_life(started_at: datetime, *moments: datetime | None) -> datetime:
    """The latest of a row's start and its lease or checkpoint times that are set (UTC)."""
    return max(as_utc(m) for m in (started_at, *moments) if m is not None)


def load_usage_leases(session: Session) -> list[UsageLease]:
    """Every open row's lease."""
    query = select(
        UsageRecord.request_id,
        UsageRecord.started_at,
        UsageRecord.checkpointed_at,
        UsageRecord.lease_renewed_at,
    ).where(UsageRecord.status == OPEN_USAGE_STATUS)
    return [
        UsageLease(rid, latest_sign_of_life(started, checkpointed, renewed))
        for rid, started, checkpointed, renewed in session.execute(query)
    ]


def close_expired_usage(session: Session, lease_timeout_s: float, now: datetime | None = None) -> int:
    """Close the open rows whose lease expired as `interrupted`, keeping their last checkpoint; returns how many.

    A row renewed between the read and the close is left open (the UPDATE re-checks its lease).
    """
    now = as_utc(now or utcnow())
    request_ids = expired_lease_request_ids(load_usage_leases(session), now, lease_timeout_s)
    if not request_ids:
        return 0
    cutoff = now - timedelta(seconds=lease_timeout_s)
    is_still_expired = or_(UsageRecord.lease_renewed_at.is_(None), UsageRecord.lease_renewed_at <= cutoff)
    return _interrupt(
        session, UsageRecord.request_id.in_(request_ids) & is_still_expired, INTERRUPTED_BY_LEASE
    )


def as_utc(moment: datetime) -> datetime:
    """The same instant as a timezone-aware UTC datetime (naive values are taken as UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
