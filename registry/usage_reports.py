"""Reports over the usage ledger (registry/usage.py): a tenant's own usage, SLO aggregation; the rows they and
billing (registry/billing.py) read.

SLO rule: a request attains its SLO when it finished `ok` with TTFT <= the plan's TTFT target and mean
TPOT <= the plan's TPOT target (a missing target always holds). Attainment = attained / judged, judged =
ok + error + interrupted (a crash is the platform's failure: it counts in the error rate too); aborted
(client went away), rejected (never admitted) and in-progress (not finished) requests are counted but not
judged.

Reports stream the period's rows (iter_rows) into one GroupTally per group: memory per group, not per request;
latency percentiles are exact up to a few hundred values per group, then within 0.5% (registry/latency_sketch.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Row, Select, select
from sqlalchemy.orm import Session

from registry.latency_sketch import LatencySketch
from registry.models import (
    INTERRUPTED_USAGE_STATUS,
    OPEN_USAGE_STATUS,
    Tenant,
    UsageRecord,
)
from registry.usage import FAILED_STATUSES, GROUP_BYS, JUDGED_STATUSES, as_utc

_K = TypeVar("_K")


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


def iter_rows(
    session: Session, start: datetime, end: datetime, tenant_id: str | None = None
) -> Iterator[UsageRow]:
    """Usage rows with start <= started_at < end, optionally for one tenant, streamed in chunks: reports fold
    them into per-group tallies as they come (GroupTally), so no report holds its period's rows (a long-running
    API process keeps a report's peak memory as RSS, and a period's rows grow with the ledger)."""
    query = usage_rows_query(start, end, tenant_id).execution_options(yield_per=LOAD_CHUNK_ROWS)
    for r in session.execute(query):
        yield to_usage_row(r)


def load_rows(
    session: Session, start: datetime, end: datetime, tenant_id: str | None = None
) -> list[UsageRow]:
    """iter_rows as a list (billing's raw days and small reads; reports stream)."""
    return list(iter_rows(session, start, end, tenant_id))


# ---- own usage -----------------------------------------------------------------------------------------


def rows_by_day_and_model(rows: Iterable[UsageRow]) -> list[tuple[str, str, list[UsageRow]]]:
    """The rows per (UTC day, model name), sorted by day then model; each group's rows in their given order
    (usage_by_adapter_day: a tenant's usage summed from raw rows, the oracle of the rolled-up pages)."""
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


class GroupTally:
    """One group's requests as they stream by: counts by status, attained requests, token sums and latency
    sketches of its ok requests. A report keeps one per group, never the rows, so its memory follows its
    number of groups, not of requests (percentiles: registry/latency_sketch.py)."""

    __slots__ = ("base_model", "completion_tokens", "counts", "latencies", "num_attained", "prompt_tokens")

    def __init__(self) -> None:
        self.counts: defaultdict[str, int] = defaultdict(int)
        self.num_attained = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.base_model: str | None = None  # of the group's first row
        self.latencies = (LatencySketch(), LatencySketch(), LatencySketch())  # ttft, tpot, e2e (ms)

    def add(self, row: UsageRow, targets: SloTargets) -> None:
        """Count one row, judged against its tenant's targets."""
        self.counts[row.status] += 1
        self.prompt_tokens += row.prompt_tokens
        self.completion_tokens += row.completion_tokens
        if self.base_model is None:
            self.base_model = row.base_model
        if row.status != "ok":
            return
        self.num_attained += is_attained(row, targets)
        for sketch, value in zip(self.latencies, (row.ttft_ms, row.tpot_ms, row.e2e_ms), strict=True):
            if value is not None:
                sketch.add(value)

    def summary(self, key: str) -> SloGroup:
        """The group's SLO row."""
        counts = self.counts
        judged = sum(counts[status] for status in JUDGED_STATUSES)
        failed = sum(counts[status] for status in FAILED_STATUSES)
        pcts = [sketch.percentile(p) for sketch in self.latencies for p in (50, 90, 99)]
        return SloGroup(
            key,
            sum(counts.values()),
            counts["ok"],
            counts["error"],
            counts["aborted"],
            counts["rejected"],
            counts[INTERRUPTED_USAGE_STATUS],
            counts[OPEN_USAGE_STATUS],
            failed / judged if judged else 0.0,
            self.num_attained / judged if judged else None,
            *pcts,
        )


def tally_groups(
    rows: Iterable[UsageRow], key_of: Callable[[UsageRow], _K], targets_by_tenant: dict[str, SloTargets]
) -> dict[_K, GroupTally]:
    """One tally per key_of(row), in one pass over the rows (which may be a stream from iter_rows)."""
    tallies: dict[_K, GroupTally] = {}
    no_targets = SloTargets()
    for row in rows:
        key = key_of(row)
        tally = tallies.get(key)
        if tally is None:
            tally = tallies[key] = GroupTally()
        tally.add(row, targets_by_tenant.get(row.tenant_id, no_targets))
    return tallies


def compute_slo(
    rows: Iterable[UsageRow], group_by: str, targets_by_tenant: dict[str, SloTargets]
) -> list[SloGroup]:
    """SLO groups sorted by key."""
    if group_by not in GROUP_BYS:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BYS)}, not {group_by!r}")
    tallies = tally_groups(rows, lambda row: group_key(row, group_by), targets_by_tenant)
    return [tallies[key].summary(key) for key in sorted(tallies)]


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
        iter_rows(session, as_utc(start), as_utc(end)), group_by, slo_targets_by_tenant(session)
    )


def hour_floor(moment: datetime) -> datetime:
    """The start of the hour containing moment (UTC)."""
    moment = as_utc(moment)
    return moment.replace(minute=0, second=0, microsecond=0)


def default_period(now: datetime | None = None) -> tuple[datetime, datetime]:
    """The default report period: the last 30 days up to now."""
    now = as_utc(now or datetime.now(UTC))
    return now - timedelta(days=30), now
