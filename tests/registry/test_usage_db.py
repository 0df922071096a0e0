"""The usage ledger on real databases (SQLite and PostgreSQL): record once, billing and SLO over a period.

`seed_ledger` writes a small known ledger; tests/api/test_reports_api.py checks the routes on the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy.orm import Session

from registry import repository
from registry.billing import adapter_days, billing_report, stored_adapter_days
from registry.models import Adapter, new_id
from registry.usage import DuplicateUsageError, record_usage
from registry.usage_reports import load_rows, slo_report

START = datetime(2026, 1, 1, tzinfo=UTC)
END = datetime(2026, 1, 3, tzinfo=UTC)


@dataclass(frozen=True)
class SeededLedger:
    """Ids of what seed_ledger wrote."""

    gold_tenant_id: str
    free_tenant_id: str
    adapter_id: str


def _usage(
    session: Session,
    tenant_id: str,
    at: datetime,
    status: str,
    prompt: int,
    completion: int,
    ttft: float | None = None,
    tpot: float | None = None,
    model: str = "writer",
    adapter_id: str | None = None,
    base_model: str = "lorahost-base",
) -> None:
    record_usage(
        session,
        request_id=f"req-{new_id()}",
        tenant_id=tenant_id,
        adapter_id=adapter_id,
        model_name=model,
        base_model_name=base_model,
        prompt_tokens=prompt,
        completion_tokens=completion,
        ttft_ms=ttft,
        tpot_ms=tpot,
        e2e_ms=(ttft or 0) + 100,
        status=status,
        started_at=at,
        finished_at=at + timedelta(seconds=1),
    )


def seed_ledger(session: Session) -> SeededLedger:
    """Two tenants, one priced plan with SLO targets, one adapter alive for the whole period, and usage.

    gold (plan: 2/1M prompt, 4/1M completion, 0.5 per adapter-day, TTFT <= 100 ms, TPOT <= 20 ms):
      in the period: ok 1000/500 (ttft 50, tpot 10: attained), ok 200/50 (ttft 150: missed),
      error 300/0, aborted 100/20, rejected 0/0; outside it: ok 9999/9999 (ignored)
    free (no plan): ok 10/5 at hour 01:00 of day 2.
    Expected gold invoice: 1600 prompt, 570 completion, 2 adapter-days
      -> 0.0032 + 0.00228 + 1.0 = 1.00548
    """
    plan = repository.create_price_plan(
        session,
        "gold",
        price_per_1m_prompt_tokens=Decimal(2),
        price_per_1m_completion_tokens=Decimal(4),
        price_storage_per_adapter_day=Decimal("0.5"),
        slo_ttft_ms=100.0,
        slo_tpot_ms=20.0,
    )
    gold = repository.create_tenant(session, "gold-corp", plan_id=plan.id)
    free = repository.create_tenant(session, "free-corp")
    adapter = Adapter(
        tenant_id=gold.id,
        name="writer",
        base_model_name="lorahost-base",
        created_at=START - timedelta(days=5),
    )
    session.add(adapter)
    session.commit()
    at = START + timedelta(hours=10)
    _usage(session, gold.id, at, "ok", 1000, 500, ttft=50, tpot=10, adapter_id=adapter.id)
    _usage(
        session, gold.id, at + timedelta(minutes=1), "ok", 200, 50, ttft=150, tpot=10, adapter_id=adapter.id
    )
    _usage(session, gold.id, at + timedelta(minutes=2), "error", 300, 0, adapter_id=adapter.id)
    _usage(
        session,
        gold.id,
        at + timedelta(minutes=3),
        "aborted",
        100,
        20,
        ttft=40,
        tpot=5,
        adapter_id=adapter.id,
    )
    _usage(session, gold.id, at + timedelta(minutes=4), "rejected", 0, 0, adapter_id=adapter.id)
    _usage(session, gold.id, END, "ok", 9999, 9999, ttft=1, tpot=1)  # end is exclusive
    _usage(
        session,
        free.id,
        START + timedelta(days=1, hours=1),
        "ok",
        10,
        5,
        ttft=30,
        tpot=3,
        model="lorahost-base",
    )
    return SeededLedger(gold.id, free.id, adapter.id)


def test_a_request_is_metered_at_most_once(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "once")
    db_session.commit()
    values = {
        "request_id": "req-dup",
        "tenant_id": tenant.id,
        "model_name": "m",
        "status": "ok",
        "started_at": START,
    }
    record_usage(db_session, **values)
    with pytest.raises(DuplicateUsageError, match="req-dup"):
        record_usage(db_session, **values)
    assert len(load_rows(db_session, START, END, tenant.id)) == 1


def test_load_rows_takes_start_inclusive_end_exclusive(db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    rows = load_rows(db_session, START, END, seeded.gold_tenant_id)
    assert len(rows) == 5 and all(START <= r.started_at < END for r in rows)
    assert len(load_rows(db_session, START, END + timedelta(seconds=1), seeded.gold_tenant_id)) == 6


def test_billing_report_bills_every_recorded_token_and_adapter_days(db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    free, gold = billing_report(db_session, START, END)  # sorted by tenant name
    assert (gold.tenant_id, free.tenant_id) == (seeded.gold_tenant_id, seeded.free_tenant_id)
    assert (gold.plan_name, gold.num_requests, gold.prompt_tokens, gold.completion_tokens) == (
        "gold",
        5,
        1600,
        570,
    )
    assert gold.adapter_days == Decimal("2.000000")
    assert (gold.prompt_cost, gold.completion_cost, gold.storage_cost) == (
        Decimal("0.003200"),
        Decimal("0.002280"),
        Decimal("1.000000"),
    )
    assert gold.total == Decimal("1.005480")
    assert (free.plan_name, free.prompt_tokens, free.completion_tokens, free.total) == (
        "none",
        10,
        5,
        Decimal(0),
    )


def test_stored_adapter_days_sum_each_adapters_days_inside_the_period_in_the_database(
    db_session: Session,
) -> None:
    tenant, other = (repository.create_tenant(db_session, f"t-{new_id()[:8]}") for _ in range(2))
    lives = [  # (tenant, base model, created, deleted)
        (tenant, "a", START - timedelta(days=3), None),  # the whole period
        (tenant, "a", START + timedelta(hours=7, microseconds=250), None),  # from inside it
        (tenant, "a", START - timedelta(days=1), START + timedelta(hours=30, seconds=17)),  # until inside it
        (tenant, "b", START + timedelta(hours=1), START + timedelta(hours=2)),  # inside it
        (tenant, "a", START - timedelta(days=4), START - timedelta(days=2)),  # gone before it
        (tenant, "a", END, None),  # created at its end (exclusive)
        (other, "a", START - timedelta(days=9), END + timedelta(days=1)),
    ]
    for i, (owner, base, created, deleted) in enumerate(lives):
        db_session.add(
            Adapter(
                tenant_id=owner.id, name=f"a{i}", base_model_name=base, created_at=created, deleted_at=deleted
            )
        )
    db_session.commit()
    expected: dict[tuple[str, str], Decimal] = {}
    for owner, base, created, deleted in lives:
        days = adapter_days(created, deleted, START, END)
        if days > 0:
            expected[(owner.id, base)] = expected.get((owner.id, base), Decimal(0)) + days
    found = {
        key: days
        for key, days in stored_adapter_days(db_session, START, END).items()
        if key[0] in (tenant.id, other.id)
    }
    assert found.keys() == expected.keys()
    for key, days in expected.items():  # to the invoice's precision (1e-6 of a day)
        assert abs(found[key] - days) < Decimal("0.0000005"), key
    assert expected[(other.id, "a")] == Decimal(2)


def test_slo_report_by_tenant_judges_ok_and_error_against_the_plan(db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    groups = {g.key: g for g in slo_report(db_session, START, END, "tenant")}
    gold = groups[seeded.gold_tenant_id]
    assert (gold.num_requests, gold.num_ok, gold.num_error, gold.num_aborted, gold.num_rejected) == (
        5,
        2,
        1,
        1,
        1,
    )
    assert gold.attainment == pytest.approx(1 / 3) and gold.error_rate == pytest.approx(1 / 3)
    assert (gold.ttft_p50, gold.ttft_p90, gold.ttft_p99) == pytest.approx((100.0, 140.0, 149.0))
    assert groups[seeded.free_tenant_id].attainment == 1.0


def test_slo_report_by_hour(db_session: Session) -> None:
    seed_ledger(db_session)
    keys = [g.key for g in slo_report(db_session, START, END, "hour")]
    assert keys == ["2026-01-01T10:00:00+00:00", "2026-01-02T01:00:00+00:00"]
