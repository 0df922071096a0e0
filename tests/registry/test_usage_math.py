import tracemalloc
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import numpy as np
import pytest

from registry.billing import (
    Prices,
    UsageTotals,
    adapter_days,
    base_model_prices,
    compute_invoice,
    invoices_to_csv,
)
from registry.latency_sketch import RELATIVE_ACCURACY
from registry.usage_reports import (
    SloTargets,
    UsageRow,
    compute_slo,
    usage_by_adapter_day,
)

T0 = datetime(2026, 11, 1, 10, 0, tzinfo=UTC)


def _row(
    status="ok",
    ttft=100.0,
    tpot=20.0,
    e2e=500.0,
    prompt=10,
    completion=5,
    tenant="t1",
    model="m",
    at=T0,
    base="",
) -> UsageRow:
    return UsageRow(tenant, None, model, base, prompt, completion, ttft, tpot, e2e, status, at)


def test_invoice_bills_every_recorded_token_at_plan_prices() -> None:
    prices = Prices("pro", Decimal("2.00"), Decimal("6.00"), Decimal("0.10"))
    rows = [
        _row(prompt=1_000_000, completion=500_000),
        _row(status="aborted", prompt=10, completion=3),
        _row(status="rejected", prompt=0, completion=0),
    ]
    line = compute_invoice("t1", "acme", prices, UsageTotals.of_rows(rows), Decimal(3))
    assert line.num_requests == 3
    assert line.prompt_tokens == 1_000_010
    assert line.completion_tokens == 500_003
    assert line.prompt_cost == Decimal("2.000020")
    assert line.completion_cost == Decimal("3.000018")
    assert line.storage_cost == Decimal("0.300000")
    assert line.total == Decimal("5.300038")


def test_adapter_days_counts_only_overlap_with_period() -> None:
    start, end = T0, T0 + timedelta(days=10)
    assert adapter_days(T0 - timedelta(days=5), None, start, end) == Decimal(10)
    assert adapter_days(T0 + timedelta(days=2), T0 + timedelta(days=3, hours=12), start, end) == Decimal(
        "1.5"
    )
    assert adapter_days(T0 - timedelta(days=5), T0 - timedelta(days=1), start, end) == Decimal(0)


def test_slo_attainment_counts_ok_meeting_targets_over_ok_plus_error() -> None:
    rows = [
        _row(ttft=100, tpot=10),
        _row(ttft=300, tpot=10),
        _row(ttft=100, tpot=50),
        _row(status="error", ttft=None, tpot=None, e2e=None),
        _row(status="aborted"),
        _row(status="rejected"),
    ]
    (group,) = compute_slo(rows, "tenant", {"t1": SloTargets(ttft_ms=200, tpot_ms=30)})
    assert (group.num_requests, group.num_ok, group.num_error, group.num_aborted, group.num_rejected) == (
        6,
        3,
        1,
        1,
        1,
    )
    assert group.attainment == pytest.approx(1 / 4)
    assert group.error_rate == pytest.approx(1 / 4)
    assert group.ttft_p50 == pytest.approx(100.0)


def test_slo_groups_by_hour_and_adapter() -> None:
    rows = [_row(at=T0), _row(at=T0 + timedelta(minutes=59), model="x"), _row(at=T0 + timedelta(hours=1))]
    by_hour = compute_slo(rows, "hour", {})
    assert [(g.key, g.num_requests) for g in by_hour] == [
        (T0.isoformat(), 2),
        ((T0 + timedelta(hours=1)).isoformat(), 1),
    ]
    by_adapter = compute_slo(rows, "adapter", {})
    assert [(g.key, g.num_requests) for g in by_adapter] == [("m", 2), ("x", 1)]
    assert by_adapter[0].attainment == 1.0


def test_unknown_group_by_is_refused() -> None:
    with pytest.raises(ValueError, match="group_by must be one of"):
        compute_slo([_row()], "week", {})


def test_invoice_csv_has_header_and_exact_decimals() -> None:
    line = compute_invoice(
        "t1",
        "acme",
        Prices("p", Decimal("1.5"), Decimal(0), Decimal(0)),
        UsageTotals.of_rows([_row(prompt=3)]),
        Decimal(0),
    )
    text = invoices_to_csv([line]).splitlines()
    assert text[0].startswith("tenant_id,tenant_name,plan_name,num_requests")
    assert "0.000005" in text[1]


def test_usage_by_day_sums_tokens_per_model() -> None:
    rows = [_row(prompt=2, completion=1), _row(prompt=3, completion=4, status="error"), _row(model="x")]
    out = usage_by_adapter_day(rows)
    assert out[0]["model"] == "m" and out[0]["prompt_tokens"] == 5 and out[0]["completion_tokens"] == 5
    assert out[0]["by_status"] == {"ok": 1, "error": 1}


def test_a_base_models_own_prices_replace_the_plans_token_prices_for_its_plan_or_every_plan() -> None:
    plan = Prices("pro", Decimal("1.0"), Decimal("2.0"), Decimal("0.5"))
    assert (
        base_model_prices(plan, None) is plan
        and base_model_prices(plan, {"basic": {"per_1m_prompt": "9"}}) is plan
    )
    own = base_model_prices(
        plan, {"pro": {"per_1m_prompt": "4", "per_1m_completion": "8"}, "*": {"per_1m_prompt": "7"}}
    )
    assert (own.per_1m_prompt, own.per_1m_completion, own.per_adapter_day) == (
        Decimal(4),
        Decimal(8),
        Decimal("0.5"),
    )
    anyone = base_model_prices(plan, {"*": {"per_1m_prompt": "7"}})
    assert (anyone.per_1m_prompt, anyone.per_1m_completion) == (Decimal(7), Decimal("2.0"))
    line = compute_invoice(
        "t1",
        "acme",
        own,
        UsageTotals.of_rows([_row(prompt=1_000_000, completion=500_000, base="wide")]),
        Decimal(0),
        "wide",
    )
    assert (line.base_model, line.prompt_cost, line.completion_cost) == ("wide", Decimal(4), Decimal(4))


def test_slo_percentiles_of_a_large_group_stay_within_the_sketch_accuracy() -> None:
    rng = np.random.default_rng(3)
    ttfts = rng.lognormal(mean=5, sigma=0.8, size=5_000)
    (group,) = compute_slo((_row(ttft=float(v)) for v in ttfts), "tenant", {})
    for pct, got in ((50, group.ttft_p50), (90, group.ttft_p90), (99, group.ttft_p99)):
        assert got == pytest.approx(float(np.percentile(ttfts, pct)), rel=RELATIVE_ACCURACY * 1.001)
    assert group.num_requests == group.num_ok == 5_000


def test_slo_report_memory_follows_groups_not_requests() -> None:
    def rows(n: int):
        for i in range(n):
            yield _row(ttft=50.0 + i % 997, model=f"m{i % 4}")

    tracemalloc.start()
    try:
        groups = compute_slo(rows(200_000), "adapter", {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [g.num_requests for g in groups] == [50_000] * 4
    # 200,000 UsageRows held at once would take > 30 MB; four tallies of ~1,000 buckets each take a few hundred KB
    assert peak < 5_000_000
