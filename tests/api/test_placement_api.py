"""The placement and autoscaling surfaces of the API: assigned_workers on the request path, GET
/v1/admin/placement, GET /v1/admin/scaling and lorahost_desired_workers."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from cluster.membership import WorkerRecord
from cluster.routing_table import ModelDemand, RoutingTable, WorkerPlacement
from scheduler.core.scheduler_stats import SchedulerStats
from scheduler.routing.router import RouteRequest, WorkerView
from tests.api.conftest import ADMIN, TenantHandle
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, add_ready_version


class RecordingRouter:
    """Routes to the first worker and remembers what it was asked."""

    def __init__(self) -> None:
        self.requests: list[RouteRequest] = []

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> str | None:
        self.requests.append(request)
        return workers[0].worker_id if workers else None


def publish(client: TestClient, table: RoutingTable) -> RoutingTable:
    services = client.app.state.services  # type: ignore[attr-defined]
    stored = services.routing_table.store.publish(table)
    services.routing_table.refresh()
    return stored


@pytest.fixture
def router(client: TestClient) -> RecordingRouter:
    services = client.app.state.services  # type: ignore[attr-defined]
    services.router = RecordingRouter()
    return services.router


def test_requests_carry_the_adapters_routing_table_row(
    client: TestClient, router: RecordingRouter, tenant: TenantHandle, db_session: Session
) -> None:
    workers = ScriptedWorkers()
    workers.install(client)
    workers.add("w1")
    workers.add("w2")
    version = add_ready_version(db_session, tenant.id, "placed", rank=16)
    add_ready_version(db_session, tenant.id, "unplaced")
    publish(client, RoutingTable(0, time.time(), {version.id: (("w1", 0.25), ("w2", 0.75))}))
    for model in ("placed", "unplaced", BASE_MODEL):
        body = {"model": model, "prompt": "hi", "max_tokens": 2}
        assert client.post("/v1/completions", json=body, headers=tenant.headers).status_code == 200
    placed, unplaced, base = router.requests
    assert placed.adapter_key == version.id and placed.assigned_workers == (("w1", 0.25), ("w2", 0.75))
    assert (placed.adapter_rank, unplaced.adapter_rank, base.adapter_rank) == (16, 4, 0)
    assert unplaced.assigned_workers == () and base.assigned_workers == ()


def test_placement_endpoint_needs_the_admin_key_and_shows_the_table(client: TestClient) -> None:
    assert client.get("/v1/admin/placement").status_code == 401
    empty = client.get("/v1/admin/placement", headers=ADMIN)
    assert empty.status_code == 200
    assert empty.json() == {
        "object": "placement",
        "version": 0,
        "computed_at": None,
        "table": {},
        "workers": [],
        "moved": [],
    }
    publish(
        client,
        RoutingTable(
            0,
            1_900_000_000.0,
            {"v1": (("w1", 1.0),)},
            (WorkerPlacement("w1", BASE_MODEL, 0.4, 16, 1),),
            ("v1",),
        ),
    )
    body = client.get("/v1/admin/placement", headers=ADMIN).json()
    assert body["version"] == 1 and body["computed_at"].startswith("2030-03-17")
    assert body["table"] == {"v1": [{"worker_id": "w1", "weight": 1.0}]}
    assert body["workers"] == [
        {"worker_id": "w1", "base_model": BASE_MODEL, "load": 0.4, "max_rank": 16, "num_adapters": 1}
    ]
    assert body["moved"] == ["v1"]


def test_scaling_endpoint_needs_the_admin_key(client: TestClient) -> None:
    assert client.get("/v1/admin/scaling").status_code == 401
    assert client.get("/v1/admin/scaling", params={"base_model": "x"}).status_code == 401


def test_scaling_reports_demand_per_base_model_in_the_exact_shape(client: TestClient) -> None:
    demand = ModelDemand(BASE_MODEL, {8: 2000.0}, {8: 2000.0}, last_request_at=time.time() - 5)
    publish(client, RoutingTable(0, time.time(), demand=(demand,)))
    body = client.get("/v1/admin/scaling", headers=ADMIN).json()
    assert list(body) == ["base_models"]
    (item,) = body["base_models"]
    assert set(item) == {"base_model", "desired_workers", "live_workers", "demand_tokens_per_s", "reason"}
    # OP[8] = 1000 / 1.128 tokens/s per worker at 80% utilisation: ceil(2000 / 886.5 / 0.8) = 3
    assert (item["base_model"], item["desired_workers"], item["live_workers"]) == (BASE_MODEL, 3, 0)
    assert item["demand_tokens_per_s"] == 2000.0
    single = client.get("/v1/admin/scaling", params={"base_model": BASE_MODEL}, headers=ADMIN).json()
    assert single == item


def test_a_request_waiting_for_a_model_without_workers_asks_for_one(client: TestClient) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    services.metrics.cold_start_waiting.labels(base_model="other-base").inc()
    body = client.get("/v1/admin/scaling", headers=ADMIN).json()
    item = next(i for i in body["base_models"] if i["base_model"] == "other-base")
    assert (item["desired_workers"], item["live_workers"]) == (1, 0) and "scale from zero" in item["reason"]
    metrics = client.get("/metrics", headers=ADMIN).text
    assert 'lorahost_desired_workers{base_model="other-base"} 1.0' in metrics


def test_idle_model_scales_to_zero_and_unknown_model_reports_zero(make_client) -> None:  # type: ignore[no-untyped-def]
    client = make_client(scale_to_zero_idle_s=60)
    old = ModelDemand(BASE_MODEL, {}, {}, last_request_at=time.time() - 120)
    publish(client, RoutingTable(0, time.time(), demand=(old,)))
    services = client.app.state.services  # type: ignore[attr-defined]
    workers = ScriptedWorkers()
    workers.add("w1")
    services.worker_directory = workers.directory
    item = client.get("/v1/admin/scaling", params={"base_model": BASE_MODEL}, headers=ADMIN).json()
    assert (item["desired_workers"], item["live_workers"]) == (0, 1) and item["reason"].startswith("idle")
    busy = WorkerRecord("w1", "http://w1", BASE_MODEL, scheduler=SchedulerStats(num_running=2))
    workers.directory.heartbeat(busy, 60)
    item = client.get("/v1/admin/scaling", params={"base_model": BASE_MODEL}, headers=ADMIN).json()
    assert item["desired_workers"] == 1  # serving now: not idle, whatever the last published demand says
    unknown = client.get("/v1/admin/scaling", params={"base_model": "nobody"}, headers=ADMIN).json()
    assert unknown["desired_workers"] == 0 and unknown["live_workers"] == 0


def test_inline_placement_places_served_adapters_and_the_next_request_carries_it(
    client: TestClient, router: RecordingRouter, tenant: TenantHandle, db_session: Session
) -> None:
    from api.main import place

    workers = ScriptedWorkers()
    workers.install(client)
    workers.add("w1")
    version = add_ready_version(db_session, tenant.id, "served")
    body = {"model": "served", "prompt": "hi", "max_tokens": 3}
    assert client.post("/v1/completions", json=body, headers=tenant.headers).status_code == 200
    services = client.app.state.services  # type: ignore[attr-defined]
    # the policy under test (the default, demand_only, publishes no rows)
    services.settings = services.settings.updated(placement_policy="loraserve")
    place(services)
    assert services.routing_table.row(version.id) == (("w1", 1.0),)
    assert client.post("/v1/completions", json=body, headers=tenant.headers).status_code == 200
    assert router.requests[0].assigned_workers == () and router.requests[-1].assigned_workers == (
        ("w1", 1.0),
    )
    placement = client.get("/v1/admin/placement", headers=ADMIN).json()
    assert placement["version"] == 1 and placement["workers"][0]["worker_id"] == "w1"


def test_a_request_waiting_on_another_api_replica_counts_too(client: TestClient) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    services.waiting_requests.publish("another-api-replica", {"remote-base": 3}, 30)
    body = client.get("/v1/admin/scaling", params={"base_model": "remote-base"}, headers=ADMIN).json()
    assert body["desired_workers"] == 1 and "3 request(s) waiting" in body["reason"]
