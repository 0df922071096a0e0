"""POST /v1/admin/plan: admin only; plans the recorded demand (usage rows over the window) or a given workload
on a shipped profile and returns the twin's check; 400/422 on bad input."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from registry.models import UsageRecord, utcnow
from tests.api.conftest import ADMIN, TenantHandle
from tests.api.test_completions_support import add_ready_version

pytestmark = pytest.mark.slow  # the planner over recorded demand runs the twin

FAST: dict[str, Any] = {"num_samples": 8, "check_s": 3.0}


@pytest.fixture
def plan_client(client: TestClient) -> TestClient:
    """The test app (its data_dir is the test's tmp_path: the surrogate's training cache goes there)."""
    return client


def record_demand(
    session: Session, tenant_id: str, version_id: str | None, n: int, ago_s: float = 10.0
) -> None:
    """n finished requests of the version, started ago_s seconds ago (the demand the planner reads)."""
    for i in range(n):
        session.add(
            UsageRecord(
                request_id=f"{version_id}-{i}-{ago_s}",
                tenant_id=tenant_id,
                adapter_version_id=version_id,
                model_name="m",
                prompt_tokens=200 + i,
                completion_tokens=50,
                status="ok",
                started_at=utcnow() - timedelta(seconds=ago_s),
            )
        )
    session.commit()


def test_plan_from_recorded_demand(
    plan_client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    hot = add_ready_version(db_session, tenant.id, "hot", rank=16)
    cold = add_ready_version(db_session, tenant.id, "cold", rank=8)
    record_demand(db_session, tenant.id, hot.id, 30)
    record_demand(db_session, tenant.id, cold.id, 3)
    record_demand(db_session, tenant.id, cold.id, 50, ago_s=7200.0)  # outside the window
    body = {**FAST, "window_s": 60.0, "slo": "ttft_p99=2s"}
    response = plan_client.post("/v1/admin/plan", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["object"] == "capacity_plan" and plan["twin_ok"] and plan["num_gpus"] >= 1
    rates = {a["adapter_id"]: a["rate"] for g in plan["gpus"] for a in g["adapters"]}
    assert rates == pytest.approx({hot.id: 30 / 60.0, cold.id: 3 / 60.0})


def test_plan_of_a_given_workload_on_a_named_profile(plan_client: TestClient) -> None:
    workload = {
        "prompt_tokens": {"p50": 100},
        "output_tokens": {"p50": 20},
        "adapters": [{"name": "a", "rank": 8, "rate": 2.0}],
    }
    body = {**FAST, "workload": workload, "profile": "a100-llama3.1-8b-vllm", "baselines": True}
    response = plan_client.post("/v1/admin/plan", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert "A100" in response.json()["profile"] and len(response.json()["baselines"]) == 2


def test_plan_is_admin_only(plan_client: TestClient, tenant: TenantHandle) -> None:
    # the project's admin routes answer 401 to a tenant key (api/deps.py require_admin), as to no key
    as_tenant = plan_client.post("/v1/admin/plan", json=FAST, headers=tenant.headers)
    assert as_tenant.status_code == 401 and "needs the admin key" in as_tenant.text
    assert plan_client.post("/v1/admin/plan", json=FAST).status_code == 401


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"window_s": 60.0}, 400, "no adapter request"),
        ({"slo": "ttft=fast"}, 400, "bad SLO"),
        ({"profile": "no-such-gpu"}, 400, "shipped: "),
        ({"workload": {"adapters": []}}, 400, "prompt_tokens"),
        ({"window_s": -1}, 422, "window_s"),
        ({"objective": "cheapest"}, 422, "objective"),
        ({"colour": "red"}, 422, "colour"),
    ],
)
def test_bad_bodies_say_what_to_fix(
    plan_client: TestClient, body: dict[str, Any], status: int, message: str
) -> None:
    response = plan_client.post("/v1/admin/plan", json={**FAST, **body}, headers=ADMIN)
    assert response.status_code == status and message in response.text, response.text
