"""The console's usage and SLO series agree with billing and the SLO report on the same rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy.orm import Session

from registry import repository
from registry.usage_series import OTHER_GROUP, bucket_start, slo_series, tenant_usage_series, total_cost
from tests.registry.test_usage_db import _usage, seed_ledger

START, END = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC)


def test_tenant_series_has_its_tokens_cost_and_attainment_per_day_and_adapter(db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    [point] = tenant_usage_series(db_session, seeded.gold_tenant_id, START, END)
    assert (point.day, point.model, point.base_model) == ("2026-01-01", "writer", "lorahost-base")
    assert (point.prompt_tokens, point.completion_tokens) == (1600, 570)  # the row at END is outside
    assert point.token_cost == Decimal("0.005480")  # the invoice's prompt + completion cost
    assert point.slo.num_requests == 5 and point.slo.attainment == pytest.approx(1 / 3)
    assert point.slo.ttft_p50 == pytest.approx(100.0)
    assert total_cost([point, point]) == Decimal("0.010960")


def test_tenant_series_holds_only_that_tenants_rows(db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    [point] = tenant_usage_series(db_session, seeded.free_tenant_id, START, END)
    assert (point.day, point.model, point.prompt_tokens, point.token_cost) == (
        "2026-01-02",
        "lorahost-base",
        10,
        0,
    )


def test_slo_series_groups_per_bucket_and_group(db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    hourly = slo_series(db_session, START, END, "tenant", "hour")
    assert [(p.bucket, p.slo.key) for p in hourly] == [
        ("2026-01-01T10:00:00+00:00", seeded.gold_tenant_id),
        ("2026-01-02T01:00:00+00:00", seeded.free_tenant_id),
    ]
    daily = slo_series(db_session, START, END, "adapter", "day")
    assert [(p.bucket, p.slo.key, p.slo.num_requests) for p in daily] == [
        ("2026-01-01T00:00:00+00:00", "writer", 5),
        ("2026-01-02T00:00:00+00:00", "lorahost-base", 1),
    ]
    with pytest.raises(ValueError, match="group_by must be one of"):
        slo_series(db_session, START, END, "hour", "hour")


def test_slo_series_keeps_the_busiest_groups_apart_and_the_rest_as_one(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "many-adapters")
    at = START + timedelta(hours=3)
    # a: 4 requests, b: 3, c: 2 (one in the next hour), d: 1, base-model rows naming none: 2 ("unknown")
    for model, num_requests in (("a", 4), ("b", 3), ("c", 2), ("d", 1)):
        for i in range(num_requests):
            moment = at + timedelta(hours=1) if (model, i) == ("c", 1) else at
            _usage(db_session, tenant.id, moment, "ok", 10, 5, ttft=10.0 * (i + 1), tpot=1.0, model=model)
    for _ in range(2):
        _usage(db_session, tenant.id, at, "ok", 10, 5, ttft=30.0, tpot=1.0, model="e", base_model="")

    points = slo_series(db_session, START, END, "adapter", "hour", max_groups=2)
    assert [(p.bucket, p.slo.key, p.slo.num_requests) for p in points] == [
        ("2026-01-01T03:00:00+00:00", OTHER_GROUP, 4),  # c, d and e's requests of that hour
        ("2026-01-01T03:00:00+00:00", "a", 4),
        ("2026-01-01T03:00:00+00:00", "b", 3),
        ("2026-01-01T04:00:00+00:00", OTHER_GROUP, 1),
    ]
    assert points[0].slo.ttft_p50 == pytest.approx(20.0)  # of c's 10, d's 10 and e's 30, 30
    by_base = slo_series(db_session, START, END, "base_model", "day", max_groups=1)
    assert [(p.slo.key, p.slo.num_requests) for p in by_base] == [(OTHER_GROUP, 2), ("lorahost-base", 10)]
    everything = slo_series(
        db_session, START, END, "adapter", "day", max_groups=5
    )  # no more groups than that
    assert [(p.slo.key, p.slo.num_requests) for p in everything] == [
        ("a", 4), ("b", 3), ("c", 2), ("d", 1), ("e", 2),
    ]  # fmt: skip


def test_bucket_start_floors_to_the_hour_or_day() -> None:
    moment = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert bucket_start(moment, "hour") == "2026-03-04T05:00:00+00:00"
    assert bucket_start(moment, "day") == "2026-03-04T00:00:00+00:00"
    with pytest.raises(ValueError, match="bucket must be one of"):
        bucket_start(moment, "week")


def test_usage_report_and_series_share_one_grouping_per_day_and_model(db_session: Session) -> None:
    from registry.usage_reports import load_rows, rows_by_day_and_model, usage_by_adapter_day

    seeded = seed_ledger(db_session)
    rows = load_rows(db_session, START, END)
    groups = rows_by_day_and_model(rows)
    assert [(day, model) for day, model, _ in groups] == sorted(
        {(r.started_at.date().isoformat(), r.model_name) for r in rows}
    )
    report = usage_by_adapter_day(rows)
    assert [(g["day"], g["model"], g["num_requests"]) for g in report] == [
        (d, m, len(rs)) for d, m, rs in groups
    ]
    points = tenant_usage_series(db_session, seeded.gold_tenant_id, START, END)
    gold = usage_by_adapter_day(load_rows(db_session, START, END, seeded.gold_tenant_id))
    assert [(p.day, p.model, p.prompt_tokens) for p in points] == [
        (g["day"], g["model"], g["prompt_tokens"]) for g in gold
    ]
