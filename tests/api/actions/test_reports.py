"""The report actions take the period as datetimes and return the API's bodies (no Request)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from api.actions import reports, usage
from registry.pages import PageRequest
from registry.usage_reports import load_rows, usage_by_adapter_day
from tests.registry.test_usage_db import seed_ledger

START, END = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC)


def test_tenant_usage_totals_the_days_and_models_of_the_period(db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    body = usage.tenant_usage(db_session, seeded.gold_tenant_id, START, END, PageRequest())
    expected = usage_by_adapter_day(load_rows(db_session, START, END, seeded.gold_tenant_id))
    assert [{k: v for k, v in d.items() if k != "id"} for d in body["data"]] == expected
    assert [d["id"] for d in body["data"]] == [f"{d['day']}:{d['model']}" for d in expected]
    assert (body["total_prompt_tokens"], body["total_completion_tokens"]) == (1600, 570)
    assert body["has_more"] is False and body["last_id"] == body["data"][-1]["id"]


def test_billing_csv_is_named_by_the_period(db_session: Session) -> None:
    seed_ledger(db_session)
    csv_file = reports.billing_csv(db_session, START, END)
    assert csv_file.filename == "billing_20260101_20260103.csv"
    assert csv_file.text.splitlines()[0].startswith("tenant")
