"""The usage ledger: one UsageRecord per request, billing invoices and SLO aggregation.

Row lifecycle (crash-safe metering, see api/metering.py): a request's row is inserted `in_progress` when it
starts, checkpointed (tokens delivered so far) while it streams and updated once to its final status. While it is
open its owner (the API process, api_instance_id) renews its lease (`lease_renewed_at`) every checkpoint
interval, streamed or not, with one UPDATE for all its open rows. A row left `in_progress` is closed
`interrupted` with its last checkpoint by whichever comes first:
- its owner starting again under the same api_instance_id (close_interrupted_usage, before it serves);
- the periodic usage sweep, when its worker left the worker directory (close_orphaned_usage);
- the same sweep, when its lease is older than settings.usage_lease_timeout_s (close_expired_usage): the
  owner died and came back under another id (a Kubernetes pod's random name) or never came back (scaled
  down). Lease ages compare the owner's clock with the sweeper's: hosts' clocks must agree to well within
  the timeout (NTP).
A final update may still overwrite an `interrupted` row (the API outlived its worker's heartbeat, or only
renewed late, and knows better); it never creates a second row.

Billing rule: every token recorded is billed once — prompt tokens of every request that was prefilled and
completion tokens that were delivered, whatever the status (an aborted stream pays for what it got; a
rejected request has zero tokens; an interrupted one pays for its last checkpoint, within one checkpoint
interval of what reached the client; an `in_progress` row counts what it has checkpointed so far, so a
report never shows less than was delivered, and grows as the request goes on). Storage is billed per
adapter-day a live adapter existed in the period.

SLO rule: a request attains its SLO when it finished `ok` with TTFT <= the plan's TTFT target and mean
TPOT <= the plan's TPOT target (a missing target always holds). Attainment = attained / judged, judged =
ok + error + interrupted (a crash is the platform's failure: it counts in the error rate too); aborted
(client went away), rejected (never admitted) and in-progress (not finished) requests are counted but not
judged.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Iterable, Literal, Sequence, cast

import numpy as np
from sqlalchemy import CursorResult, Table, Update, bindparam, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from registry.models import (
    INTERRUPTED_USAGE_STATUS,
    OPEN_USAGE_STATUS,
    Adapter,
    PricePlan,
    Tenant,
    UsageRecord,
    utcnow,
)

GroupBy = Literal["tenant", "adapter", "hour"]
GROUP_BYS: tuple[str, ...] = ("tenant", "adapter", "hour")
JUDGED_STATUSES = ("ok", "error", INTERRUPTED_USAGE_STATUS)
FAILED_STATUSES = ("error", INTERRUPTED_USAGE_STATUS)
# Rows a final update may still close: open ones, and ones a sweep closed while the API still served them.
CLOSABLE_STATUSES = (OPEN_USAGE_STATUS, INTERRUPTED_USAGE_STATUS)
INTERRUPTED_BY_RESTART = "the API process stopped (crash or kill) before the request ended; billed to its last checkpoint"
INTERRUPTED_BY_WORKER = "the worker left the worker directory before the request ended; billed to its last checkpoint"
INTERRUPTED_BY_LEASE = (
    "the API process serving the request stopped renewing its usage lease (crash or kill, scale-down, or a restart "
    "under another api_instance_id) before the request ended; billed to its last checkpoint"
)
CENT = Decimal("0.000001")


class DuplicateUsageError(ValueError):
    """A usage record for this request id exists already (a request is metered exactly once)."""


def record_usage(session: Session, **values: object) -> UsageRecord:
    """Insert one request's usage row and commit; raises DuplicateUsageError if request_id was metered."""
    record = UsageRecord(**values)
    session.add(record)
    try:
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        raise DuplicateUsageError(f"request {values.get('request_id')!r} is already metered") from exc
    return record


def open_usage(session: Session, rows: Sequence[dict[str, object]]) -> None:
    """Insert `in_progress` rows, all in one transaction (none is written if one fails)."""
    session.add_all(UsageRecord(**values) for values in rows)
    session.commit()


CHECKPOINT_FIELDS = ("prompt_tokens", "completion_tokens", "ttft_ms", "tpot_ms", "e2e_ms", "worker_id",
                     "checkpointed_at")
_CHECKPOINT = (
    update(cast(Table, UsageRecord.__table__))
    .where(UsageRecord.request_id == bindparam("b_request_id"), UsageRecord.status == OPEN_USAGE_STATUS)
    .values({name: bindparam(f"b_{name}") for name in CHECKPOINT_FIELDS})
)


def checkpoint_usage(session: Session, checkpoints: Sequence[dict[str, object]]) -> None:
    """Update the tokens and latencies of still-open rows, all in one transaction (closed rows are left alone).

    Each checkpoint has `request_id` and every CHECKPOINT_FIELDS key.
    """
    if not checkpoints:
        return
    params = [{f"b_{name}": value for name, value in c.items()} for c in checkpoints]
    session.connection().execute(_CHECKPOINT, params)
    session.commit()


def finish_usage(session: Session, values: dict[str, object]) -> bool:
    """Give an open (or swept) row its final values; False, changing nothing, when no such row exists."""
    request_id = values["request_id"]
    result = _execute_dml(
        session,
        update(UsageRecord)
        .where(UsageRecord.request_id == request_id, UsageRecord.status.in_(CLOSABLE_STATUSES))
        .values({k: v for k, v in values.items() if k != "request_id"})
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return bool(result.rowcount)


def _execute_dml(session: Session, statement: Update) -> CursorResult[Any]:
    return cast(CursorResult[Any], session.execute(statement))


def _interrupt(session: Session, condition: object, message: str) -> int:
    result = _execute_dml(
        session,
        update(UsageRecord)
        .where(UsageRecord.status == OPEN_USAGE_STATUS, condition)  # type: ignore[arg-type]
        .values(
            status=INTERRUPTED_USAGE_STATUS,
            error_message=message,
            finished_at=func.coalesce(UsageRecord.checkpointed_at, UsageRecord.started_at),
        )
        .execution_options(synchronize_session=False)
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
    query = select(UsageRecord.request_id, UsageRecord.worker_id, UsageRecord.checkpointed_at, UsageRecord.started_at)
    query = query.where(UsageRecord.status == OPEN_USAGE_STATUS, UsageRecord.worker_id.is_not(None))
    return [OpenUsage(rid, wid, as_utc(seen or started)) for rid, wid, seen, started in session.execute(query)]


def close_orphaned_usage(
    session: Session, live_worker_ids: set[str], grace_s: float, now: datetime | None = None
) -> list[str]:
    """Close the open rows of workers that left the directory as `interrupted`; returns their request ids."""
    request_ids = orphaned_request_ids(load_open_usage(session), live_worker_ids, now or utcnow(), grace_s)
    if request_ids:
        _interrupt(session, UsageRecord.request_id.in_(request_ids), INTERRUPTED_BY_WORKER)
    return request_ids


def renew_usage_leases(session: Session, api_instance_id: str, now: datetime | None = None) -> int:
    """Renew the lease of every row this owner holds open, with one UPDATE, and commit; returns how many.

    Call it once per checkpoint interval while the owner process has requests running (api/metering.py).
    """
    result = _execute_dml(
        session,
        update(UsageRecord)
        .where(UsageRecord.api_instance_id == api_instance_id, UsageRecord.status == OPEN_USAGE_STATUS)
        .values(lease_renewed_at=now or utcnow())
        .execution_options(synchronize_session=False)
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
        lease.request_id for lease in leases if (as_utc(now) - as_utc(lease.renewed_at)).total_seconds() >= timeout_s
    )


def latest_sign_of_life(started_at: datetime, *moments: datetime | None) -> datetime:
    """The latest of a row's start and its lease or checkpoint times that are set (UTC)."""
    return max(as_utc(m) for m in (started_at, *moments) if m is not None)


def load_usage_leases(session: Session) -> list[UsageLease]:
    """Every open row's lease."""
    query = select(
        UsageRecord.request_id, UsageRecord.started_at, UsageRecord.checkpointed_at, UsageRecord.lease_renewed_at
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
    return _interrupt(session, UsageRecord.request_id.in_(request_ids) & is_still_expired, INTERRUPTED_BY_LEASE)


@dataclass(frozen=True)
class UsageRow:
    """The fields of a usage record that billing and SLO math need (plain data)."""

    tenant_id: str
    adapter_id: str | None
    model_name: str
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    status: str
    started_at: datetime


@dataclass(frozen=True)
class SloTargets:
    """A plan's latency targets in ms (None = no target)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None


def as_utc(moment: datetime) -> datetime:
    """The same instant as a timezone-aware UTC datetime (naive values are taken as UTC)."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def load_rows(session: Session, start: datetime, end: datetime, tenant_id: str | None = None) -> list[UsageRow]:
    """Usage rows with start <= started_at < end, optionally for one tenant."""
    query = select(UsageRecord).where(UsageRecord.started_at >= start, UsageRecord.started_at < end)
    if tenant_id is not None:
        query = query.where(UsageRecord.tenant_id == tenant_id)
    return [
        UsageRow(r.tenant_id, r.adapter_id, r.model_name, r.prompt_tokens, r.completion_tokens, r.ttft_ms,
                 r.tpot_ms, r.e2e_ms, r.status, as_utc(r.started_at))
        for r in session.scalars(query)
    ]


# ---- billing -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prices:
    """A plan's prices (Decimal currency units)."""

    plan_name: str = "none"
    per_1m_prompt: Decimal = Decimal(0)
    per_1m_completion: Decimal = Decimal(0)
    per_adapter_day: Decimal = Decimal(0)


@dataclass(frozen=True)
class InvoiceLine:
    """One tenant's bill for a period."""

    tenant_id: str
    tenant_name: str
    plan_name: str
    num_requests: int
    prompt_tokens: int
    completion_tokens: int
    adapter_days: Decimal
    prompt_cost: Decimal
    completion_cost: Decimal
    storage_cost: Decimal
    total: Decimal


def adapter_days(created_at: datetime, deleted_at: datetime | None, start: datetime, end: datetime) -> Decimal:
    """How many days (fractional) an adapter existed inside [start, end)."""
    lo = max(as_utc(created_at), start)
    hi = min(as_utc(deleted_at), end) if deleted_at is not None else end
    if hi <= lo:
        return Decimal(0)
    return Decimal((hi - lo).total_seconds()) / Decimal(86400)


def price_tokens(num_tokens: int, per_1m: Decimal) -> Decimal:
    """Cost of num_tokens at a per-million price, rounded to 1e-6."""
    return (Decimal(num_tokens) * per_1m / Decimal(1_000_000)).quantize(CENT, rounding=ROUND_HALF_UP)


def compute_invoice(
    tenant_id: str, tenant_name: str, prices: Prices, rows: Iterable[UsageRow], num_adapter_days: Decimal
) -> InvoiceLine:
    """One tenant's invoice line from its usage rows and adapter-days."""
    rows = list(rows)
    prompt = sum(r.prompt_tokens for r in rows)
    completion = sum(r.completion_tokens for r in rows)
    prompt_cost = price_tokens(prompt, prices.per_1m_prompt)
    completion_cost = price_tokens(completion, prices.per_1m_completion)
    storage_cost = (num_adapter_days * prices.per_adapter_day).quantize(CENT, rounding=ROUND_HALF_UP)
    return InvoiceLine(
        tenant_id, tenant_name, prices.plan_name, len(rows), prompt, completion,
        num_adapter_days.quantize(CENT, rounding=ROUND_HALF_UP), prompt_cost, completion_cost, storage_cost,
        prompt_cost + completion_cost + storage_cost,
    )


def _prices(plan: PricePlan | None) -> Prices:
    if plan is None:
        return Prices()
    return Prices(plan.name, Decimal(plan.price_per_1m_prompt_tokens), Decimal(plan.price_per_1m_completion_tokens),
                  Decimal(plan.price_storage_per_adapter_day))


def billing_report(session: Session, start: datetime, end: datetime) -> list[InvoiceLine]:
    """Invoice lines for every tenant with usage or stored adapters in [start, end), by tenant name."""
    start, end = as_utc(start), as_utc(end)
    rows_by_tenant: dict[str, list[UsageRow]] = defaultdict(list)
    for row in load_rows(session, start, end):
        rows_by_tenant[row.tenant_id].append(row)
    days_by_tenant: dict[str, Decimal] = defaultdict(Decimal)
    for adapter in session.scalars(select(Adapter).where(Adapter.created_at < end)):
        days_by_tenant[adapter.tenant_id] += adapter_days(adapter.created_at, adapter.deleted_at, start, end)
    lines = []
    for tenant in session.scalars(select(Tenant)):
        rows, days = rows_by_tenant.get(tenant.id, []), days_by_tenant.get(tenant.id, Decimal(0))
        if rows or days > 0:
            lines.append(compute_invoice(tenant.id, tenant.name, _prices(tenant.plan), rows, days))
    return sorted(lines, key=lambda line: (line.tenant_name, line.tenant_id))


def invoice_to_json(line: InvoiceLine) -> dict[str, object]:
    """JSON-ready dict (Decimals as strings, exact)."""
    return {k: (str(v) if isinstance(v, Decimal) else v) for k, v in asdict(line).items()}


def invoices_to_csv(lines: Sequence[InvoiceLine]) -> str:
    """CSV text with a header row."""
    out = io.StringIO()
    names = [f.name for f in fields(InvoiceLine)]
    writer = csv.DictWriter(out, fieldnames=names)
    writer.writeheader()
    for line in lines:
        writer.writerow(invoice_to_json(line))
    return out.getvalue()


# ---- own usage -----------------------------------------------------------------------------------------


def usage_by_adapter_day(rows: Iterable[UsageRow]) -> list[dict[str, object]]:
    """Totals per (day, model_name): requests, prompt and completion tokens, by status."""
    groups: dict[tuple[str, str], dict[str, object]] = {}
    for r in rows:
        key = (r.started_at.date().isoformat(), r.model_name)
        g = groups.setdefault(key, {"day": key[0], "model": key[1], "num_requests": 0, "prompt_tokens": 0,
                                     "completion_tokens": 0, "by_status": defaultdict(int)})
        g["num_requests"] += 1  # type: ignore[operator]
        g["prompt_tokens"] += r.prompt_tokens  # type: ignore[operator]
        g["completion_tokens"] += r.completion_tokens  # type: ignore[operator]
        g["by_status"][r.status] += 1  # type: ignore[index]
    result = []
    for key in sorted(groups):
        g = groups[key]
        g["by_status"] = dict(g["by_status"])  # type: ignore[call-overload]
        result.append(g)
    return result


# ---- SLO -----------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), pct))


def is_attained(row: UsageRow, targets: SloTargets) -> bool:
    """True when an ok request met both latency targets."""
    if row.status != "ok":
        return False
    if targets.ttft_ms is not None and (row.ttft_ms is None or row.ttft_ms > targets.ttft_ms):
        return False
    if targets.tpot_ms is not None and row.tpot_ms is not None and row.tpot_ms > targets.tpot_ms:
        return False
    return True


@dataclass(frozen=True)
class SloGroup:
    """Latency percentiles, attainment and counts for one group of requests."""

    key: str
    num_requests: int
    num_ok: int
    num_error: int
    num_aborted: int
    num_rejected: int
    num_interrupted: int
    num_in_progress: int
    error_rate: float
    attainment: float | None
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    tpot_p99: float | None
    e2e_p50: float | None
    e2e_p90: float | None
    e2e_p99: float | None


def group_key(row: UsageRow, group_by: str) -> str:
    """The group a row belongs to."""
    if group_by == "tenant":
        return row.tenant_id
    if group_by == "adapter":
        return row.model_name
    if group_by == "hour":
        return row.started_at.replace(minute=0, second=0, microsecond=0).isoformat()
    raise ValueError(f"group_by must be one of {', '.join(GROUP_BYS)}, not {group_by!r}")


def summarize_group(key: str, rows: Sequence[UsageRow], targets_by_tenant: dict[str, SloTargets]) -> SloGroup:
    """Aggregate one group's rows."""
    counts: defaultdict[str, int] = defaultdict(int)
    for r in rows:
        counts[r.status] += 1
    ok = [r for r in rows if r.status == "ok"]
    judged = sum(counts[status] for status in JUDGED_STATUSES)
    failed = sum(counts[status] for status in FAILED_STATUSES)
    attained = sum(is_attained(r, targets_by_tenant.get(r.tenant_id, SloTargets())) for r in ok)

    def pcts(attr: str) -> list[float | None]:
        values = [getattr(r, attr) for r in ok if getattr(r, attr) is not None]
        return [percentile(values, p) for p in (50, 90, 99)]

    ttft, tpot, e2e = pcts("ttft_ms"), pcts("tpot_ms"), pcts("e2e_ms")
    return SloGroup(
        key, len(rows), counts["ok"], counts["error"], counts["aborted"], counts["rejected"],
        counts[INTERRUPTED_USAGE_STATUS], counts[OPEN_USAGE_STATUS],
        failed / judged if judged else 0.0, attained / judged if judged else None,
        *ttft, *tpot, *e2e,
    )


def compute_slo(rows: Iterable[UsageRow], group_by: str, targets_by_tenant: dict[str, SloTargets]) -> list[SloGroup]:
    """SLO groups sorted by key."""
    groups: dict[str, list[UsageRow]] = defaultdict(list)
    for row in rows:
        groups[group_key(row, group_by)].append(row)
    return [summarize_group(k, groups[k], targets_by_tenant) for k in sorted(groups)]


def slo_targets_by_tenant(session: Session) -> dict[str, SloTargets]:
    """Each tenant's SLO targets from its plan."""
    result = {}
    for tenant in session.scalars(select(Tenant)):
        plan = tenant.plan
        result[tenant.id] = SloTargets(plan.slo_ttft_ms, plan.slo_tpot_ms) if plan else SloTargets()
    return result


def slo_report(session: Session, start: datetime, end: datetime, group_by: str) -> list[SloGroup]:
    """SLO table for [start, end) grouped by tenant, adapter (model name) or hour."""
    if group_by not in GROUP_BYS:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BYS)}, not {group_by!r}")
    return compute_slo(load_rows(session, as_utc(start), as_utc(end)), group_by, slo_targets_by_tenant(session))


def hour_floor(moment: datetime) -> datetime:
    """The start of the hour containing moment (UTC)."""
    moment = as_utc(moment)
    return moment.replace(minute=0, second=0, microsecond=0)


def default_period(now: datetime | None = None) -> tuple[datetime, datetime]:
    """The default report period: the last 30 days up to now."""
    now = as_utc(now or datetime.now(timezone.utc))
    return now - timedelta(days=30), now
