"""The operator's console pages: tenants and plans (with changes made through the admin handlers), billing
and its CSV, SLO over time, workers, placement and scaling, predictor accuracy and the planner's what-if."""

from __future__ import annotations

import csv
import io
import re
import time
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.console.templating import TEMPLATES
from cluster.protocol import EngineSummary
from registry.models import Tenant
from registry.usage_series import MAX_SERIES_GROUPS
from scheduler.core.scheduler_stats import SchedulerStats
from tests.api.conftest import ADMIN_KEY, TenantHandle
from tests.api.console.console_support import publish_worker, sign_in
from tests.api.test_completions_support import add_ready_version
from tests.api.test_plan_api import process_is_gone, record_demand
from tests.registry.test_usage_db import _usage, seed_ledger

PERIOD = {"start": "2026-01-01", "end": "2026-01-03T00:00:00Z"}


def test_tenants_page_creates_tenants_and_plans_and_changes_them(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    csrf = sign_in(client, ADMIN_KEY)
    page = client.get("/console/admin/tenants")
    assert page.status_code == 200 and f'data-tenant="{tenant.name}"' in page.text
    plan = client.post(
        "/console/admin/plans",
        data={"csrf_token": csrf, "name": "pro", "price_per_1m_prompt_tokens": "1.5", "slo_ttft_ms": "200"},
    )
    assert plan.status_code == 200 and "created plan pro" in plan.text
    bad_plan = client.post(
        "/console/admin/plans", data={"csrf_token": csrf, "name": "x", "slo_ttft_ms": "-1"}
    )
    assert bad_plan.status_code == 400 and "slo_ttft_ms" in bad_plan.text
    created = client.post("/console/admin/tenants", data={"csrf_token": csrf, "name": "newco"})
    assert created.status_code == 200 and "created tenant newco" in created.text
    allowed = client.post(
        f"/console/admin/tenants/{tenant.id}", data={"csrf_token": csrf, "can_manage_keys": "true"}
    )
    assert allowed.status_code == 200
    disabled = client.post(
        f"/console/admin/tenants/{tenant.id}", data={"csrf_token": csrf, "is_active": "false"}
    )
    assert disabled.status_code == 200
    db_session.expire_all()
    row = db_session.get(Tenant, tenant.id)
    assert row is not None and row.can_manage_keys and not row.is_active
    assert client.get("/v1/adapters", headers=tenant.headers).status_code == 403  # the cache was invalidated
    issued = client.post(f"/console/admin/tenants/{tenant.id}/keys", data={"csrf_token": csrf})
    assert 'id="new-key">lh_' in issued.text
    missing = client.post("/console/admin/tenants/nope/keys", data={"csrf_token": csrf})
    assert missing.status_code == 404 and "does not exist" in missing.text


def test_billing_page_and_csv_match_the_invoice(client: TestClient, db_session: Session) -> None:
    seed_ledger(db_session)
    sign_in(client, ADMIN_KEY)
    page = client.get("/console/admin/billing", params=PERIOD)
    assert page.status_code == 200 and "gold-corp" in page.text and "1.005480" in page.text
    download = client.get("/console/admin/billing.csv", params=PERIOD)
    assert download.status_code == 200 and "attachment" in download.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(download.text)))
    assert [(r["tenant_name"], r["total"]) for r in rows] == [
        ("free-corp", "0.000000"),
        ("gold-corp", "1.005480"),
    ]
    assert 'href="/console/admin/billing.csv?start=2026-01-01T00:00:00%2B00:00' in page.text


def test_slo_page_charts_attainment_and_percentiles_by_group(client: TestClient, db_session: Session) -> None:
    seed_ledger(db_session)
    sign_in(client, ADMIN_KEY)
    by_tenant = client.get("/console/admin/slo", params={**PERIOD, "bucket": "day"})
    assert by_tenant.status_code == 200 and "gold-corp" in by_tenant.text  # ids shown by name
    assert by_tenant.text.count("data-chart=") == 5 and "33.3%" in by_tenant.text
    by_adapter = client.get("/console/admin/slo", params={**PERIOD, "group_by": "adapter"})
    assert "<td>writer</td>" in by_adapter.text and "(other)" not in by_adapter.text


def test_slo_page_shows_the_busiest_adapters_apart_and_the_rest_together(
    client: TestClient, db_session: Session
) -> None:
    seeded = seed_ledger(db_session)  # "writer": 5 requests that day, "lorahost-base": 1 the next
    at = datetime(2026, 1, 1, 20, tzinfo=UTC)
    for i in range(MAX_SERIES_GROUPS):  # as many adapters again, each with 2 requests
        for _ in range(2):
            _usage(
                db_session, seeded.gold_tenant_id, at, "ok", 10, 5, ttft=40.0, tpot=5.0, model=f"extra-{i}"
            )
    sign_in(client, ADMIN_KEY)
    page = client.get("/console/admin/slo", params={**PERIOD, "group_by": "adapter", "bucket": "day"})
    assert page.status_code == 200 and "<td>writer</td>" in page.text  # the busiest, apart
    assert "<td>(other)</td><td>1</td>" in page.text  # the day after: "lorahost-base" is among the rest
    assert f"The {MAX_SERIES_GROUPS} adapters with the most requests" in page.text


def test_workers_page_shows_queues_pages_and_resident_adapters_by_name(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    version = add_ready_version(db_session, tenant.id, "hot")
    core = SchedulerStats(
        num_running=3, num_waiting=2, num_waiting_by_queue=(1, 1), num_pool_pages=100, num_kv_pages_used=30,
        num_adapter_pages=10, num_free_pool_pages=60, device_adapters=(version.id,), num_adapter_hits=7,
        num_adapter_misses=4,
    )  # fmt: skip
    engine = EngineSummary(backend="vllm", decode_step_ms=12.5, prefill_step_ms=40.0)
    publish_worker(client, scheduler=core, engine=engine)
    sign_in(client, ADMIN_KEY)
    page = client.get("/console/admin/workers")
    assert page.status_code == 200 and "<code>w1</code>" in page.text
    assert "30 / 10 / 60 / 100" in page.text and "1 / 1" in page.text and "7 / 4" in page.text
    assert "<td>vllm</td>" in page.text and "<td>3</td><td>2</td>" in page.text
    assert "12.5 ms / 40.0 ms" in page.text and "Device</b> (1)" in page.text
    assert f"{tenant.name}/hot@1" in page.text and "data-chart=" in page.text


def test_placement_page_shows_the_table_and_the_scaling_history(client: TestClient) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    services.scaling.sample()
    sign_in(client, ADMIN_KEY)
    page = client.get("/console/admin/placement")
    assert page.status_code == 200 and "No placement published yet" in page.text
    assert "Desired vs live workers" in page.text


def test_predictor_page_reports_the_served_model(client: TestClient) -> None:
    sign_in(client, ADMIN_KEY)
    page = client.get("/console/admin/predictor")
    assert page.status_code == 200 and "Serving" in page.text
    bad = client.get("/console/admin/predictor", params={"window_s": -1})
    assert bad.status_code == 200 and "window_s must be in" in bad.text


def test_planner_refuses_a_bad_slo_or_no_demand_with_a_message(client: TestClient) -> None:
    csrf = sign_in(client, ADMIN_KEY)
    assert client.get("/console/admin/planner").status_code == 200
    bad = client.post("/console/admin/planner", data={"slo": "fast please"}, headers={"X-CSRF-Token": csrf})
    assert bad.status_code == 400 and 'class="error"' in bad.text
    empty = client.post("/console/admin/planner", data={"window_s": "60"}, headers={"X-CSRF-Token": csrf})
    assert empty.status_code == 400 and 'class="error"' in empty.text


def _plan_job_id(html: str) -> str:
    match = re.search(r'hx-get="/console/admin/planner/jobs/([0-9a-f-]+)" hx-trigger="every 1s"', html)
    assert match, html
    return match.group(1)


@pytest.mark.slow  # the planner trains its surrogate on twin runs and checks every GPU in the twin
def test_planner_answers_how_many_gpus_the_recorded_demand_needs(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    hot = add_ready_version(db_session, tenant.id, "hot", rank=16)
    record_demand(db_session, tenant.id, hot.id, 30)
    csrf = sign_in(client, ADMIN_KEY)
    form = {"window_s": "60", "slo": "ttft_p99=2s", "num_samples": "8", "check_s": "3"}
    response = client.post("/console/admin/planner", data=form, headers={"X-CSRF-Token": csrf})
    assert response.status_code == 200, response.text
    job_id = _plan_job_id(response.text)  # the fragment polls its job every second while it waits or runs
    assert 'id="plan-cancel"' in response.text
    assert client.app.state.services.plan_runner.wait(job_id, 300.0)  # type: ignore[attr-defined]
    done = client.get(f"/console/admin/planner/jobs/{job_id}")
    assert 'id="plan-gpus"' in done.text and "within the SLO" in done.text
    assert f'"adapter_id": "{hot.id}"' in done.text  # the full plan, in the details
    assert "every 1s" not in done.text  # done: no more polling


@pytest.mark.slow  # a plan's child process starts
def test_planner_job_is_cancelled_from_its_fragment(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    hot = add_ready_version(db_session, tenant.id, "hot", rank=16)
    record_demand(db_session, tenant.id, hot.id, 30)
    csrf = sign_in(client, ADMIN_KEY)
    form = {"window_s": "60", "num_samples": "2000", "check_s": "600"}  # minutes of twin runs
    job_id = _plan_job_id(
        client.post("/console/admin/planner", data=form, headers={"X-CSRF-Token": csrf}).text
    )
    runner = client.app.state.services.plan_runner  # type: ignore[attr-defined]
    deadline = time.monotonic() + 300.0
    while (pid := runner.child_pid(job_id)) is None:
        assert time.monotonic() < deadline, "the plan's process never started"
        time.sleep(0.05)
    cancelled = client.post(f"/console/admin/planner/jobs/{job_id}/cancel", headers={"X-CSRF-Token": csrf})
    assert cancelled.status_code == 200 and 'data-status="cancelled"' in cancelled.text, cancelled.text
    assert "every 1s" not in cancelled.text
    assert process_is_gone(pid)


def test_planner_cancel_needs_csrf_and_unknown_jobs_are_404(client: TestClient) -> None:
    csrf = sign_in(client, ADMIN_KEY)
    assert client.post("/console/admin/planner/jobs/nope/cancel").status_code == 403
    missing = client.post("/console/admin/planner/jobs/nope/cancel", headers={"X-CSRF-Token": csrf})
    assert missing.status_code == 404 and 'class="error"' in missing.text
    assert client.get("/console/admin/planner/jobs/nope").status_code == 404


def test_a_plan_whose_twin_check_saw_no_request_says_so() -> None:
    twin = {"num_requests": 0, "throughput_tok_s": 0.0, "ttft_p99_s": 0.0}
    result = {"num_gpus": 1, "objective": "throughput", "notes": [], "gpus": [{"adapters": [], "twin": twin}]}
    html = TEMPLATES.get_template("admin_plan_result.html").render(result=result)
    assert 'id="plan-vacuous"' in html
    twin["num_requests"] = 12
    assert 'id="plan-vacuous"' not in TEMPLATES.get_template("admin_plan_result.html").render(result=result)
