"""The inference path's policy seams (api/inference/): the output-length prediction carried end to end, the
router chosen by settings, and one HTTP status per worker error code (cluster.protocol)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.inference.predict import MaxTokensPredictor, PredictionInput
from cluster.membership import WorkerRecord
from cluster.protocol import WORKER_ERROR_STATUS, tenant_status
from scheduler.core.scheduler_stats import SchedulerStats
from scheduler.routing.holder_router import HoldersLeastLoaded
from tests.api.conftest import ADMIN, TenantHandle
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, tokens_events, usage_rows


def _complete(client: TestClient, tenant: TenantHandle, **body: object):  # type: ignore[no-untyped-def]
    return client.post(
        "/v1/completions", json={"model": BASE_MODEL, "prompt": "hi", **body}, headers=tenant.headers
    )


class FixedPredictor:
    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens
        self.inputs: list[PredictionInput] = []

    def predict(self, request: PredictionInput) -> int:
        self.inputs.append(request)
        return self.num_tokens


# ---- the tenant's fair-share weight, end to end ------------------------------------------------------------


def _tenant_on_plan(
    client: TestClient, new_tenant: Callable[[str], TenantHandle], **plan: object
) -> TenantHandle:
    created = client.post(
        "/v1/admin/plans", json={"name": f"plan-{uuid.uuid4().hex[:6]}", **plan}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    tenant = new_tenant(f"t-{uuid.uuid4().hex[:6]}")
    patched = client.patch(
        f"/v1/admin/tenants/{tenant.id}", json={"plan_id": created.json()["id"]}, headers=ADMIN
    )
    assert patched.status_code == 200, patched.text
    return tenant


def test_the_plans_fair_share_weight_is_sent_to_the_worker_with_the_tenant(
    client: TestClient,
    workers: ScriptedWorkers,
    new_tenant: Callable[[str], TenantHandle],
    tenant: TenantHandle,
) -> None:
    worker = workers.add("w1", events=tokens_events(1))
    heavy = _tenant_on_plan(client, new_tenant, fair_share_weight=2.5)
    unweighted = _tenant_on_plan(client, new_tenant)  # a plan without a weight: 1
    for sender in (heavy, unweighted, tenant):  # `tenant` has no plan: 1
        assert _complete(client, sender).status_code == 200
    sent = [(r.tenant_id, r.tenant_weight) for r in worker.requests]
    assert sent == [(heavy.id, 2.5), (unweighted.id, 1.0), (tenant.id, 1.0)]


def test_the_default_router_keeps_a_light_tenant_on_a_worker_where_only_a_flooder_queues(
    client: TestClient,
    workers: ScriptedWorkers,
    new_tenant: Callable[[str], TenantHandle],
    tenant: TenantHandle,
) -> None:
    """Worker x has free slots and 30 of the flooder's requests queued, y is busier with no queue: the route
    request carries the tenant, so the light tenant goes to x (fair share serves it after about one of the
    flooder's) and the flooder to y (its own backlog is ahead of it)."""
    flooder = new_tenant("flooder")
    x, y = workers.add("x", events=tokens_events(1)), workers.add("y", events=tokens_events(1))
    for worker_id, worker, running, queued in (("x", x, 2, {flooder.id: 30}), ("y", y, 4, {})):
        record = WorkerRecord(
            worker_id,
            worker.url,
            BASE_MODEL,
            max_num_seqs=8,
            scheduler=SchedulerStats(
                num_running=running, num_waiting=sum(queued.values()), num_waiting_by_tenant=queued
            ),
        )
        workers.directory.heartbeat(record, ttl_s=3600)
    assert _complete(client, tenant).status_code == 200
    assert _complete(client, flooder).status_code == 200
    assert [r.tenant_id for r in x.requests] == [tenant.id]
    assert [r.tenant_id for r in y.requests] == [flooder.id]


# ---- the prediction, end to end --------------------------------------------------------------------------


def test_max_tokens_is_the_prediction_sent_to_the_worker_and_recorded_in_usage(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    worker = workers.add("w1", events=tokens_events(2))
    assert _complete(client, tenant, max_tokens=5).status_code == 200
    assert worker.requests[0].predicted_output_tokens == 5
    [row] = usage_rows(db_session, tenant.id)
    assert (row.predicted_output_tokens, row.completion_tokens) == (5, 2)


@pytest.mark.parametrize(("predicted", "expected"), [(3, 3), (100, 6), (0, 1)])
def test_a_plugged_in_predictor_is_clamped_to_one_and_max_tokens(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    predicted: int,
    expected: int,
) -> None:
    predictor = FixedPredictor(predicted)
    client.app.state.services.predictor = predictor  # type: ignore[attr-defined]
    worker = workers.add("w1", events=tokens_events(2))
    assert _complete(client, tenant, max_tokens=6).status_code == 200
    assert worker.requests[0].predicted_output_tokens == expected
    [seen] = predictor.inputs
    assert (seen.tenant_id, seen.adapter_key, seen.max_tokens) == (tenant.id, None, 6)
    assert seen.num_prompt_tokens == len(worker.requests[0].prompt_token_ids or [])
    assert usage_rows(db_session, tenant.id)[0].predicted_output_tokens == expected


def test_a_request_refused_before_the_prediction_records_none(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    assert _complete(client, tenant, n=0).status_code == 400
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.predicted_output_tokens) == ("rejected", None)


def test_the_default_predictor_predicts_max_tokens() -> None:
    assert MaxTokensPredictor().predict(PredictionInput("t", None, 10, 7)) == 7


# ---- the router, chosen by settings -------------------------------------------------------------------------


def test_the_worker_client_routes_with_the_services_router(client: TestClient) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    assert isinstance(services.router, HoldersLeastLoaded)  # the default, settings.routing.policy
    assert services.worker_client.router is services.router


# ---- one status per worker error code -------------------------------------------------------------------


def test_adapter_unavailable_is_424_at_the_api_as_at_the_worker_without_retry_after(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    status = WORKER_ERROR_STATUS["adapter_unavailable"]
    workers.add("w1", status_code=status, error_type="adapter_unavailable")
    response = _complete(client, tenant)
    assert response.status_code == status == 424
    error = response.json()["error"]
    assert error["type"] == "adapter_unavailable" and "upload a new version" in error["message"]
    assert "retry-after" not in response.headers  # a blind retry fails the same way
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.worker_id) == ("error", "w1")


def test_a_worker_refusing_the_internal_token_is_a_502_not_the_tenants_401(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    workers.add("w1", status_code=WORKER_ERROR_STATUS["unauthorized"], error_type="unauthorized")
    response = _complete(client, tenant)
    assert response.status_code == 502 and response.json()["error"]["type"] == "worker_error"


@pytest.mark.parametrize("code", sorted(WORKER_ERROR_STATUS))
def test_tenant_status_passes_request_codes_through_and_hides_deployment_failures(code: str) -> None:
    expected = 502 if code in ("unauthorized", "internal") else WORKER_ERROR_STATUS[code]
    assert tenant_status(code) == expected
    assert tenant_status("no_such_code") == tenant_status(None) == 502


class FirstWorkerRouter:
    def choose(self, request, workers):  # type: ignore[no-untyped-def]
        return workers[0].worker_id if workers else None


def test_settings_router_policy_picks_the_services_router(
    tmp_path, db_session_factory, blob_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.services import build_services
    from scheduler.routing import router_policies
    from settings import Settings

    monkeypatch.setitem(router_policies.ROUTER_POLICIES, "first_worker", FirstWorkerRouter)
    settings = Settings(data_dir=tmp_path, admin_key="x", router_policy="first_worker")
    services = build_services(settings, session_factory=db_session_factory, blob_store=blob_store)
    try:
        assert isinstance(services.router, FirstWorkerRouter)
    finally:
        services.close()


def test_an_unknown_router_policy_setting_is_refused_naming_the_choices(tmp_path) -> None:
    from pydantic import ValidationError

    from settings import Settings

    with pytest.raises(ValidationError, match="residency_least_loaded"):
        Settings(data_dir=tmp_path, router_policy="round_robin")
