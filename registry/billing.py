"""Billing over the usage ledger: invoice lines per tenant and base model, CSV and JSON.

Billing rule: every token recorded is billed once — prompt tokens of every request that was prefilled and
completion tokens that were delivered, whatever the status (an aborted stream pays for what it got; a
rejected request has zero tokens; an interrupted one pays for its last checkpoint, within one checkpoint
interval of what reached the client; an `in_progress` row counts what it has checkpointed so far, so a
report never shows less than was delivered, and grows as the request goes on). Storage is billed per
adapter-day a live adapter existed in the period. A tenant gets one invoice line per base model it used or stored
adapters for; a catalog model's own prices for the tenant's plan (base_models.prices: the plan's name, else "*")
replace the plan's token prices on that line.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from sqlalchemy import ColumnElement, case, func, literal, select
from sqlalchemy.orm import Session

from registry.model_base import UTCDateTime
from registry.models import Adapter, CatalogModel, PricePlan, Tenant
from registry.usage import CENT, as_utc
from registry.usage_days import UsageTotals, usage_sums


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
    base_model: str = ""  # the base model of this line's requests and adapters


INVOICE_FIELDS = tuple(f.name for f in fields(InvoiceLine))


def adapter_days(
    created_at: datetime, deleted_at: datetime | None, start: datetime, end: datetime
) -> Decimal:
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
    tenant_id: str,
    tenant_name: str,
    prices: Prices,
    totals: UsageTotals,
    num_adapter_days: Decimal,
    base_model: str = "",
) -> InvoiceLine:
    """One tenant's invoice line (of one base model) from its usage totals and adapter-days."""
    prompt_cost = price_tokens(totals.prompt_tokens, prices.per_1m_prompt)
    completion_cost = price_tokens(totals.completion_tokens, prices.per_1m_completion)
    storage_cost = (num_adapter_days * prices.per_adapter_day).quantize(CENT, rounding=ROUND_HALF_UP)
    return InvoiceLine(
        tenant_id,
        tenant_name,
        prices.plan_name,
        totals.num_requests,
        totals.prompt_tokens,
        totals.completion_tokens,
        num_adapter_days.quantize(CENT, rounding=ROUND_HALF_UP),
        prompt_cost,
        completion_cost,
        storage_cost,
        prompt_cost + completion_cost + storage_cost,
        base_model,
    )


def prices_of_plan(plan: PricePlan | None) -> Prices:
    """A plan's prices (no plan: everything free)."""
    if plan is None:
        return Prices()
    return Prices(
        plan.name,
        Decimal(plan.price_per_1m_prompt_tokens),
        Decimal(plan.price_per_1m_completion_tokens),
        Decimal(plan.price_storage_per_adapter_day),
    )


def base_model_prices(plan_prices: Prices, base_prices: dict[str, dict[str, str]] | None) -> Prices:
    """The token prices on a base model's line: the model's own for this plan (its name, else "*"), else the
    plan's; storage stays the plan's."""
    own = (base_prices or {}).get(plan_prices.plan_name) or (base_prices or {}).get("*")
    if not own:
        return plan_prices
    return Prices(
        plan_prices.plan_name,
        Decimal(own.get("per_1m_prompt", plan_prices.per_1m_prompt)),
        Decimal(own.get("per_1m_completion", plan_prices.per_1m_completion)),
        plan_prices.per_adapter_day,
    )


def catalog_prices(session: Session) -> dict[str, dict[str, dict[str, str]] | None]:
    """Each ready catalog model's own prices per plan name (base_models.prices)."""
    return {m.name: m.prices for m in session.scalars(select(CatalogModel)) if m.status == "ready"}


def usage_totals(session: Session, start: datetime, end: datetime) -> dict[tuple[str, str], UsageTotals]:
    """UsageTotals per (tenant id, base model; "" for base-model rows recorded before rows named it) of the
    usage rows with start <= started_at < end, summed in the database: the rolled days from the daily rollup,
    the rest from the raw rows (registry/usage_days.py; no row leaves the database)."""
    sums = usage_sums(session, as_utc(start), as_utc(end), by_tenant=True)
    return {(tenant_id, base_model): totals for (tenant_id, base_model), totals in sums.items()}


def stored_adapter_days(session: Session, start: datetime, end: datetime) -> dict[tuple[str, str], Decimal]:
    """Adapter-days (adapter_days, summed) per (tenant id, base model) of the adapters that existed in
    [start, end), summed in the database (a big registry has ~80,000 adapters alive in a month)."""
    start, end = as_utc(start), as_utc(end)
    lo = case((Adapter.created_at > start, Adapter.created_at), else_=literal(start, UTCDateTime()))
    hi = case(
        (Adapter.deleted_at.is_not(None) & (Adapter.deleted_at < end), Adapter.deleted_at),
        else_=literal(end, UTCDateTime()),
    )
    seconds: ColumnElement[Any]
    if session.get_bind().dialect.name == "postgresql":
        seconds = func.extract("epoch", hi - lo)  # numeric: exact to the microsecond
    else:
        seconds = (func.julianday(hi) - func.julianday(lo)) * 86400
    query = (
        select(Adapter.tenant_id, Adapter.base_model_name, func.sum(seconds))
        .where(Adapter.created_at < end, Adapter.deleted_at.is_(None) | (Adapter.deleted_at > start))
        .group_by(Adapter.tenant_id, Adapter.base_model_name)
    )
    return {
        (tenant_id, base_model): Decimal(str(total)) / Decimal(86400)
        for tenant_id, base_model, total in session.execute(query)
    }


def billing_report(session: Session, start: datetime, end: datetime) -> list[InvoiceLine]:
    """Invoice lines for every (tenant, base model) with usage or stored adapters in [start, end), by tenant
    name, then base model."""
    start, end = as_utc(start), as_utc(end)
    totals_by_key = usage_totals(session, start, end)
    days_by_key = stored_adapter_days(session, start, end)
    prices_by_base = catalog_prices(session)
    bases_by_tenant: dict[str, set[str]] = defaultdict(set)
    for tenant_id, base in (*totals_by_key, *days_by_key):
        bases_by_tenant[tenant_id].add(base)
    prices_by_plan = {plan.id: prices_of_plan(plan) for plan in session.scalars(select(PricePlan))}
    lines = []
    for tenant_id, tenant_name, plan_id in session.execute(select(Tenant.id, Tenant.name, Tenant.plan_id)):
        plan_prices = prices_by_plan.get(plan_id, Prices()) if plan_id is not None else Prices()
        for base in sorted(bases_by_tenant.get(tenant_id, ())):
            totals = totals_by_key.get((tenant_id, base), UsageTotals())
            days = days_by_key.get((tenant_id, base), Decimal(0))
            if totals.num_requests or days > 0:
                prices = base_model_prices(plan_prices, prices_by_base.get(base))
                lines.append(compute_invoice(tenant_id, tenant_name, prices, totals, days, base))
    return sorted(lines, key=lambda line: (line.tenant_name, line.tenant_id, line.base_model))


def invoice_to_json(line: InvoiceLine) -> dict[str, object]:
    """JSON-ready dict (Decimals as strings, exact). Read field by field: `asdict` deep-copies every value, a
    third of a 10,000-tenant bill's time."""
    return {name: (str(v) if isinstance(v := getattr(line, name), Decimal) else v) for name in INVOICE_FIELDS}


def invoices_to_csv(lines: Sequence[InvoiceLine]) -> str:
    """CSV text with a header row."""
    out = io.StringIO()
    names = [f.name for f in fields(InvoiceLine)]
    writer = csv.DictWriter(out, fieldnames=names)
    writer.writeheader()
    for line in lines:
        writer.writerow(invoice_to_json(line))
    return out.getvalue()
