"""Time series over the usage ledger for the console's charts: a tenant's usage per day and adapter (tokens,
token cost, TTFT/TPOT percentiles, SLO attainment) and the operator's SLO per hour or day and group.

The same rows, prices and SLO math as billing and the SLO report (registry/billing.py,
registry/usage_reports.py): a chart never disagrees with the invoice or /v1/admin/slo for the same period.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.billing import base_model_prices, catalog_prices, price_tokens, prices_of_plan
from registry.models import Tenant, UsageRecord
from registry.usage import as_utc
from registry.usage_reports import (
    SloGroup,
    SloTargets,
    UsageRow,
    group_key,
    iter_rows,
    slo_targets_by_tenant,
    tally_groups,
)

SERIES_GROUP_BYS: tuple[str, ...] = ("tenant", "adapter", "base_model")
BUCKETS: tuple[str, ...] = ("hour", "day")
# groups an SLO series keeps apart: the busiest of the period; the others' requests are one group, OTHER_GROUP
# (a series holds one tally of ~1 KB per bucket and group: 350 adapters per hour over 30 days would be 250,000)
MAX_SERIES_GROUPS = 20
OTHER_GROUP = "(other)"
# the SQL of group_key per group_by (base_model: "unknown" for a row naming none, as group_key says)
_GROUP_COLUMNS = {
    "tenant": UsageRecord.tenant_id,
    "adapter": UsageRecord.model_name,
    "base_model": func.coalesce(func.nullif(UsageRecord.base_model_name, ""), "unknown"),
}


@dataclass(frozen=True)
class UsagePoint:
    """One tenant's requests of one adapter (model name) on one UTC day."""

    day: str  # YYYY-MM-DD
    model: str
    base_model: str
    prompt_tokens: int
    completion_tokens: int
    token_cost: Decimal  # prompt + completion tokens at the tenant's prices for that base model
    slo: SloGroup  # counts, percentiles (ms) and attainment; slo.key == model


@dataclass(frozen=True)
class SloPoint:
    """The SLO of one group (tenant id, adapter name or base model) in one hour or day."""

    bucket: str  # ISO start of the hour or day (UTC)
    slo: SloGroup  # slo.key is the group


def bucket_start(moment: datetime, bucket: str) -> str:
    """The ISO start of the hour or day (UTC) that holds moment."""
    moment = as_utc(moment).replace(minute=0, second=0, microsecond=0)
    if bucket == "day":
        moment = moment.replace(hour=0)
    elif bucket != "hour":
        raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}, not {bucket!r}")
    return moment.isoformat()


def tenant_usage_series(session: Session, tenant_id: str, start: datetime, end: datetime) -> list[UsagePoint]:
    """The tenant's usage in [start, end) per (day, model name), sorted by day then model."""
    tenant = session.get(Tenant, tenant_id)
    plan_row = tenant.plan if tenant is not None else None
    plan = prices_of_plan(plan_row)
    prices_by_base = catalog_prices(session)
    targets = SloTargets(plan_row.slo_ttft_ms, plan_row.slo_tpot_ms) if plan_row else SloTargets()
    tallies = tally_groups(
        iter_rows(session, as_utc(start), as_utc(end), tenant_id),
        lambda row: (row.started_at.date().isoformat(), row.model_name),
        {tenant_id: targets},
    )
    points = []
    for (day, model), tally in sorted(tallies.items()):
        base = tally.base_model or ""
        prices = base_model_prices(plan, prices_by_base.get(base))
        prompt, completion = tally.prompt_tokens, tally.completion_tokens
        cost = price_tokens(prompt, prices.per_1m_prompt) + price_tokens(completion, prices.per_1m_completion)
        points.append(UsagePoint(day, model, base, prompt, completion, cost, tally.summary(model)))
    return points


def busiest_groups(
    session: Session, start: datetime, end: datetime, group_by: str, max_groups: int
) -> set[str] | None:
    """The max_groups groups with the most requests in [start, end) (ties: by key), counted in the database;
    None when there are no more than that."""
    column = _GROUP_COLUMNS[group_by]
    count = func.count()
    query = (
        select(column, count)
        .where(UsageRecord.started_at >= as_utc(start), UsageRecord.started_at < as_utc(end))
        .group_by(column)
        .order_by(count.desc(), column)
        .limit(max_groups + 1)
    )
    keys = [str(key) for key, _ in session.execute(query)]
    return None if len(keys) <= max_groups else set(keys[:max_groups])


def slo_series(
    session: Session,
    start: datetime,
    end: datetime,
    group_by: str,
    bucket: str,
    max_groups: int = MAX_SERIES_GROUPS,
) -> list[SloPoint]:
    """Every tenant's requests in [start, end) per (hour or day, group), sorted by bucket then group: the
    max_groups busiest groups of the period, the requests of any other in OTHER_GROUP."""
    if group_by not in SERIES_GROUP_BYS:
        raise ValueError(f"group_by must be one of {', '.join(SERIES_GROUP_BYS)}, not {group_by!r}")
    targets = slo_targets_by_tenant(session)
    if bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}, not {bucket!r}")
    kept = busiest_groups(session, start, end, group_by, max_groups)

    def key_of(row: UsageRow) -> tuple[str, str]:
        key = group_key(row, group_by)
        return bucket_start(row.started_at, bucket), key if kept is None or key in kept else OTHER_GROUP

    tallies = tally_groups(iter_rows(session, as_utc(start), as_utc(end)), key_of, targets)
    return [SloPoint(b, tally.summary(key)) for (b, key), tally in sorted(tallies.items())]


CSV_COLUMNS = (
    "day", "model", "base_model", "num_requests", "prompt_tokens", "completion_tokens", "token_cost",
    "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "slo_attainment",
)  # fmt: skip


def usage_points_to_csv(points: list[UsagePoint]) -> str:
    """The points as CSV (CSV_COLUMNS; empty cells where a percentile or attainment has no value)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for p in points:
        slo = p.slo
        writer.writerow((
            p.day, p.model, p.base_model, slo.num_requests, p.prompt_tokens, p.completion_tokens, p.token_cost,
            *("" if v is None else round(v, 3) for v in (slo.ttft_p50, slo.ttft_p99, slo.tpot_p50, slo.tpot_p99)),
            "" if slo.attainment is None else round(slo.attainment, 4),
        ))  # fmt: skip
    return out.getvalue()


def total_cost(points: list[UsagePoint]) -> Decimal:
    """The token cost of all points."""
    return sum((p.token_cost for p in points), Decimal(0))
