"""Admin reports over HTTP (billing JSON/CSV, SLO groups), /metrics, and `lorahost report` on a seeded DB."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from lorahost.cli import app as cli_app
from registry.db import make_engine, make_session_factory
from tests.api.conftest import ADMIN, TenantHandle
from tests.registry.test_usage_db import seed_ledger

PERIOD = {"start": "2026-01-01", "end": "2026-01-03T00:00:00Z"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_billing_json_has_exact_invoice_lines(client: TestClient, db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    response = client.get("/v1/admin/billing", params=PERIOD, headers=ADMIN)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["start"] == "2026-01-01T00:00:00+00:00" and body["end"] == "2026-01-03T00:00:00+00:00"
    gold = next(line for line in body["data"] if line["tenant_id"] == seeded.gold_tenant_id)
    assert (gold["prompt_tokens"], gold["completion_tokens"], gold["num_requests"]) == (1600, 570, 5)
    assert (gold["prompt_cost"], gold["completion_cost"], gold["storage_cost"], gold["total"]) == (
        "0.003200",
        "0.002280",
        "1.000000",
        "1.005480",
    )


def test_billing_csv_is_text_csv_with_the_same_lines(client: TestClient, db_session: Session) -> None:
    seed_ledger(db_session)
    response = client.get("/v1/admin/billing", params={**PERIOD, "format": "csv"}, headers=ADMIN)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    assert "attachment" in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [(r["tenant_name"], r["total"]) for r in rows] == [
        ("free-corp", "0.000000"),
        ("gold-corp", "1.005480"),
    ]


def test_slo_groups_by_tenant_adapter_and_hour(client: TestClient, db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    by_tenant = client.get("/v1/admin/slo", params={**PERIOD, "group_by": "tenant"}, headers=ADMIN).json()
    gold = next(g for g in by_tenant["data"] if g["key"] == seeded.gold_tenant_id)
    assert gold["attainment"] == pytest.approx(1 / 3) and gold["error_rate"] == pytest.approx(1 / 3)
    assert (gold["ttft_p50"], gold["ttft_p90"], gold["ttft_p99"]) == pytest.approx((100.0, 140.0, 149.0))
    assert (gold["num_ok"], gold["num_error"], gold["num_aborted"], gold["num_rejected"]) == (2, 1, 1, 1)
    by_adapter = client.get("/v1/admin/slo", params={**PERIOD, "group_by": "adapter"}, headers=ADMIN).json()
    assert [g["key"] for g in by_adapter["data"]] == ["lorahost-base", "writer"]
    by_hour = client.get("/v1/admin/slo", params={**PERIOD, "group_by": "hour"}, headers=ADMIN).json()
    assert [g["num_requests"] for g in by_hour["data"]] == [5, 1]


@pytest.mark.parametrize(
    ("path", "params", "expected"),
    [
        ("/v1/admin/slo", {"group_by": "day"}, "group_by must be one of tenant, adapter, base_model, hour"),
        ("/v1/admin/slo", {"start": "yesterday"}, "ISO 8601"),
        ("/v1/admin/billing", {"end": "2026-13-01"}, "ISO 8601"),
        ("/v1/admin/billing", {"format": "xml"}, "format must be one of json, csv"),
        ("/v1/admin/billing", {"start": "2026-02-01", "end": "2026-01-01"}, "must be before end"),
    ],
)
def test_bad_report_parameters_are_400s_saying_the_accepted_format(
    client: TestClient, path: str, params: dict[str, str], expected: str
) -> None:
    response = client.get(path, params=params, headers=ADMIN)
    assert response.status_code == 400 and expected in response.json()["error"]["message"]


def test_reports_need_the_admin_key(client: TestClient, tenant: TenantHandle) -> None:
    for path in ("/v1/admin/billing", "/v1/admin/slo"):
        assert client.get(path, headers=tenant.headers).status_code == 401
        assert client.get(path).status_code == 401


def test_plans_are_created_and_listed_with_limits_and_slo_targets(client: TestClient) -> None:
    plan = {
        "name": "pro",
        "price_per_1m_prompt_tokens": "1.5",
        "requests_per_min": 60,
        "tokens_per_min": 10000,
        "slo_ttft_ms": 500,
        "slo_tpot_ms": 50,
    }
    created = client.post("/v1/admin/plans", json=plan, headers=ADMIN)
    assert created.status_code == 201, created.text
    listed = client.get("/v1/admin/plans", headers=ADMIN).json()["data"]
    [pro] = [p for p in listed if p["name"] == "pro"]
    assert (pro["requests_per_min"], pro["tokens_per_min"], pro["slo_ttft_ms"]) == (60, 10000, 500)


def test_metrics_are_prometheus_text(client: TestClient) -> None:
    response = client.get("/metrics", headers=ADMIN)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(response.text)}
    assert {"lorahost_requests", "lorahost_tokens", "lorahost_ttft_ms"} <= names


@pytest.fixture
def seeded_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An embedded data dir whose SQLite DB is migrated and holds the seeded ledger (committed)."""
    from migrations.runner import upgrade

    for var in ("LORAHOST_DATABASE_URL", "LORAHOST_REDIS_URL"):
        monkeypatch.delenv(var, raising=False)
    url = f"sqlite:///{tmp_path / 'lorahost.db'}"
    upgrade(url)
    engine = make_engine(url)
    with make_session_factory(engine)() as session:
        seed_ledger(session)
    engine.dispose()
    return tmp_path


def test_cli_report_billing_prints_json_and_csv(seeded_data_dir: Path) -> None:
    runner = CliRunner()
    args = [
        "report",
        "billing",
        "--start",
        "2026-01-01",
        "--end",
        "2026-01-03",
        "--data-dir",
        str(seeded_data_dir),
    ]
    as_json = runner.invoke(cli_app, [*args, "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    assert [line["total"] for line in json.loads(as_json.output)] == ["0.000000", "1.005480"]
    as_csv = runner.invoke(cli_app, [*args, "--format", "csv"])
    assert as_csv.exit_code == 0 and as_csv.output.startswith("tenant_id,tenant_name")
    table = runner.invoke(cli_app, args)
    assert table.exit_code == 0 and "gold-corp" in table.output


def test_cli_report_slo_writes_tables_and_valid_pngs(seeded_data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "slo-out"
    result = CliRunner().invoke(
        cli_app,
        [
            "report",
            "slo",
            "--out",
            str(out),
            "--start",
            "2026-01-01",
            "--end",
            "2026-01-03",
            "--data-dir",
            str(seeded_data_dir),
        ],
    )
    assert result.exit_code == 0, result.output
    for group_by in ("tenant", "adapter", "hour"):
        assert (out / f"slo_{group_by}.csv").is_file()
        assert json.loads((out / f"slo_{group_by}.json").read_text())
    for name in ("latency_over_time.png", "attainment_by_tenant.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
        from PIL import Image

        with Image.open(out / name) as image:
            image.verify()
            assert image.size[0] > 100 and image.size[1] > 100
