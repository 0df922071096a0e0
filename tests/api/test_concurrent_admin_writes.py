"""Concurrent admin writes through the real API app on a SQLite FILE database (embedded mode) and PostgreSQL:
each runs in a write transaction (SQLite BEGIN IMMEDIATE), so none fails with "database is locked" (a 500),
and concurrent creations of one plan name give one 201 and 409s."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from settings import Settings
from tests.api.conftest import ADMIN, ADMIN_KEY

pytestmark = pytest.mark.slow  # threads racing admin writes through the database

NUM_ROUNDS = 6  # each round sends one of every admin write below, all at once


@pytest.fixture
def real_client(fresh_db_url: str, tmp_path: Path, base_model_dir: Path) -> Iterator[TestClient]:
    """The app as embedded mode builds it: its own engine on the database, really committing."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=fresh_db_url,
        admin_key=ADMIN_KEY,
        base_model_path=base_model_dir,
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def _admin_writes(
    client: TestClient, tenant_id: str, plan_id: str, key_ids: list[str]
) -> list[Callable[[], object]]:
    """One of each admin write; every one but the plan creation reads a row before it writes."""

    def post(route: str, body: object = None) -> Callable[[], object]:
        return lambda: client.post(route, json=body, headers=ADMIN)

    return [
        post("/v1/admin/tenants", {"name": "acme", "plan_id": plan_id}),
        post(f"/v1/admin/tenants/{tenant_id}/keys"),
        lambda: client.patch(f"/v1/admin/tenants/{tenant_id}", json={"plan_id": plan_id}, headers=ADMIN),
        *(
            lambda key_id=key_id: client.delete(f"/v1/admin/keys/{key_id}", headers=ADMIN)
            for key_id in key_ids
        ),
        post("/v1/admin/plans", {"name": "same-name"}),
    ]


def test_concurrent_admin_writes_never_fail_and_plan_names_stay_unique(real_client: TestClient) -> None:
    client = real_client
    plan_id = client.post("/v1/admin/plans", json={"name": "base"}, headers=ADMIN).json()["id"]
    tenant_id = client.post("/v1/admin/tenants", json={"name": "first"}, headers=ADMIN).json()["id"]
    key_ids = [
        client.post(f"/v1/admin/tenants/{tenant_id}/keys", headers=ADMIN).json()["id"] for _ in range(2)
    ]
    writes = _admin_writes(client, tenant_id, plan_id, key_ids) * NUM_ROUNDS
    barrier = threading.Barrier(len(writes))

    def run(write: Callable[[], object]) -> tuple[str, int, str]:
        barrier.wait()
        response = write()
        return response.request.url.path, response.status_code, response.text  # type: ignore[attr-defined]

    with ThreadPoolExecutor(len(writes)) as pool:
        results = list(pool.map(run, writes))

    assert [r for r in results if r[1] >= 500] == []
    plan_statuses = sorted(status for path, status, _ in results if path == "/v1/admin/plans")
    assert plan_statuses == [201] + [409] * (NUM_ROUNDS - 1)
    plans = client.get("/v1/admin/plans", headers=ADMIN).json()["data"]
    assert sorted(p["name"] for p in plans) == ["base", "same-name"]
    tenants = client.get("/v1/admin/tenants", headers=ADMIN).json()["data"]
    assert len(tenants) == 1 + NUM_ROUNDS and all(t["plan_id"] == plan_id for t in tenants)
