"""Reports over the usage ledger (registry/usage.py): a tenant's own usage, SLO aggregation; the rows they and
billing (registry/billing.py) read.

SLO rule: a request attains its SLO when it finished `ok` with TTFT <= the plan's TTFT target and mean
TPOT <= the plan's TPOT target (a missing target always holds). Attainment = attained / judged, judged =
ok + error + interrupted (a crash is the platform's failure: it counts in the error rate too); aborted
(client went away), rejected (never admitted) and in-progress (not finished) requests are counted but not
judged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Row, Select, select
from sqlalchemy.orm import Session

from registry.models import (
    INTERRUPTED_USAGE_STATUS,
    OPEN_USAGE_STATUS,
    Tenant,
    UsageRecord,
)
from registry.usage import FAILED_STATUSES, GROUP_BYS, JUDGED_STATUSES, as_utc


@dataclass(frozen=True, slots=True)
class UsageRow:
    """The fields of a usage record that billing and SLO math need (plain data; slots: a report holds one per
    request of its period)."""

    tenant_id: str
    adapter_id: str | None
    model_name: str
    base_model: str  # "" for base-model requests recorded before usage rows named their base model
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


def usage_rows_query(
    start: datetime, end: datetime, tenant_id: str | None = None
) -> Select[*tuple[Any, ...]]:
    """The columns reports read (no ORM objects, no prompt features) of the usage rows with
    start <= started_at < end, optionally of one tenant (index ix_usage_records_tenant_started)."""
    query: Select[*tuple[Any, ...]] = select(
        UsageRecord.tenant_id,
        UsageRecord.adapter_id,
        UsageRecord.model_name,
        UsageRecord.base_model_name,
        UsageRecord.prompt_tokens,
        UsageRecord.completion_tokens,
        UsageRecord.ttft_ms,
        UsageRecord.tpot_ms,
        UsageRecord.e2e_ms,
        UsageRecord.status,
        UsageRecord.started_at,
    ).where(UsageRecord.started_at >= start, UsageRecord.started_at < end)
    if tenant_id is not None:
        query = query.where(UsageRecord.tenant_id == tenant_id)
    return query


def to_usage_row(r: Row[Any]) -> UsageRow:
    """A row of usage_rows_query as plain data."""
    return UsageRow(
        r.tenant_id,
        r.adapter_id,
        r.model_name,
        r.base_model_name or "",
        r.prompt_tokens,
        r.completion_tokens,
        r.ttft_ms,
        r.tpot_ms,
        r.e2e_ms,
        r.status,
        as_utc(r.started_at),
    )


LOAD_CHUNK_ROWS = 5000  # rows fetched from the database at a time (a server-side cursor on PostgreSQL)


def load_rows(
    session: Session, start: datetime, end: datetime, tenant_id: str | None = None
) -> list[UsageRow]:
    """Usage rows with start <= started_at < end, optionally for one tenant. Fetched in chunks: the driver's and
    SQLAlchemy's copies of the whole result would otherwise sit beside the UsageRows until the last one is
    built, tripling the report's peak memory (which a long-running API process then keeps as RSS)."""
    query = usage_rows_query(start, end, tenant_id).execution_options(yield_per=LOAD_CHUNK_ROWS)
    return [to_usage_row(r) for r in session.execute(query)]


# ---- own usage -----------------------------------------------------------------------------------------


def rows_by_day_and_model(rows: Iterable[UsageRow]) -> list[tuple[str, str, list[UsageRow]]]:
    """The rows per (UTC day, model name), sorted by day then model; each group's rows in their given order.
    The one grouping behind a tenant's usage report (usage_by_adapter_day) and its charts
    (registry/usage_series.py)."""
    groups: dict[tuple[str, str], list[UsageRow]] = defaultdict(list)
    for row in rows:
        groups[(row.started_at.date().isoformat(), row.model_name)].append(row)
    return [(day, model, group) for (day, model), group in sorted(groups.items())]


def usage_by_adapter_day(rows: Iterable[UsageRow]) -> list[dict[str, object]]:
    """Totals per (day, model_name): requests, prompt and completion tokens, by status."""
    return [_usage_totals(day, model, group) for day, model, group in rows_by_day_and_model(rows)]


def _usage_totals(day: str, model: str, rows: list[UsageRow]) -> dict[str, object]:
    by_status: defaultdict[str, int] = defaultdict(int)
    for r in rows:
        by_status[r.status] += 1
    return {
        "day": day,
        "model": model,
        "base_model": rows[0].base_model or None,
        "num_requests": len(rows),
        "prompt_tokens": sum(r.prompt_tokens for r in rows),
        "completion_tokens": sum(r.completion_tokens for r in rows),
        "by_status": dict(by_status),
    }


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
    return not (targets.tpot_ms is not None and row.tpot_ms is not None and row.tpot_ms > targets.tpot_ms)


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
    if group_by == "base_model":
        return row.base_model or "unknown"
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
        key,
        len(rows),
        counts["ok"],
        counts["error"],
        counts["aborted"],
        counts["rejected"],
        counts[INTERRUPTED_USAGE_STATUS],
        counts[OPEN_USAGE_STATUS],
        failed / judged if judged else 0.0,
        attained / judged if judged else None,
        *ttft,
        *tpot,
        *e2e,
    )


def compute_slo(
    rows: Iterable[UsageRow], group_by: str, targets_by_tenant: dict[str, SloTargets]
) -> list[SloGroup]:
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
    return compute_slo(
        load_rows(session, as_utc(start), as_utc(end)), group_by, slo_targets_by_tenant(session)
    )


def hour_floor(moment: datetime) -> datetime:
    """The start of the hour containing moment (UTC)."""
    moment = as_utc(moment)
    return moment.replace(minute=0, second=0, microsecond=0)


def default_period(now: datetime | None = None) -> tuple[datetime, datetime]:
    """The default report period: the last 30 days up to now."""
    now = as_utc(now or datetime.now(UTC))
    return now - timedelta(days=30), now
