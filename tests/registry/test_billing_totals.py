"""Billing sums the usage ledger in the database (registry/billing.py usage_totals): the same totals, per tenant
and base model, as adding up the raw rows one by one, whatever the statuses, the period's edges and the rows
recorded before usage rows named their base model."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from registry import repository
from registry.billing import UsageTotals, billing_report, usage_totals
from registry.models import USAGE_STATUSES, UsageRecord, new_id
from registry.usage_reports import load_rows

T0 = datetime(2026, 3, 1, tzinfo=UTC)
START, END = T0 + timedelta(days=2), T0 + timedelta(days=9)


def _add_rows(session: Session, tenant_ids: list[str], rng: random.Random, num_rows: int) -> None:
    moments = [START, END, START - timedelta(microseconds=1), END - timedelta(microseconds=1)]
    for i in range(num_rows):
        at = moments[i] if i < len(moments) else T0 + timedelta(seconds=rng.uniform(0, 12 * 86400))
        session.add(
            UsageRecord(
                request_id=new_id(),
                tenant_id=rng.choice(tenant_ids),
                model_name=rng.choice(["a", "b", "base"]),
                base_model_name=rng.choice(["small", "wide", None]),
                prompt_tokens=rng.randrange(0, 5000),
                completion_tokens=rng.randrange(0, 900),
                status=rng.choice(sorted(USAGE_STATUSES)),
                started_at=at,
            )
        )
    session.flush()


def _summed_one_by_one(session: Session) -> dict[tuple[str, str], UsageTotals]:
    groups = defaultdict(list)
    for row in load_rows(session, START, END):
        groups[(row.tenant_id, row.base_model)].append(row)
    return {key: UsageTotals.of_rows(rows) for key, rows in groups.items()}


def test_the_databases_sums_equal_the_raw_rows_added_up_one_by_one(db_session: Session) -> None:
    tenant_ids = [repository.create_tenant(db_session, f"t-{new_id()[:8]}").id for _ in range(3)]
    _add_rows(db_session, tenant_ids, random.Random(7), 400)
    expected = _summed_one_by_one(db_session)
    totals = {key: t for key, t in usage_totals(db_session, START, END).items() if key[0] in tenant_ids}
    assert totals == expected
    assert any(base == "" for _, base in totals)  # rows without a base model are their own line
    lines = {
        (line.tenant_id, line.base_model): line
        for line in billing_report(db_session, START, END)
        if line.tenant_id in tenant_ids
    }
    assert {
        key: UsageTotals(ln.num_requests, ln.prompt_tokens, ln.completion_tokens) for key, ln in lines.items()
    } == (expected)


def test_a_row_at_the_periods_end_belongs_to_the_next_period(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, f"t-{new_id()[:8]}").id
    for at, tokens in ((START, 10), (END, 1000)):
        db_session.add(
            UsageRecord(
                request_id=new_id(),
                tenant_id=tenant,
                model_name="a",
                base_model_name="small",
                prompt_tokens=tokens,
                status="ok",
                started_at=at,
            )
        )
    db_session.flush()
    assert usage_totals(db_session, START, END)[(tenant, "small")] == UsageTotals(1, 10, 0)
    assert usage_totals(db_session, END, END + timedelta(days=1))[(tenant, "small")] == UsageTotals(
        1, 1000, 0
    )
