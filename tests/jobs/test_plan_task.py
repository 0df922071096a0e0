"""Capacity-plan jobs on Celery: a real worker process (--pool=solo) runs the plan the API queued and writes the
job row; a cancelled running plan's process is killed (the worker is free for the next plan at once, with
planner_max_running = 1)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from settings import Settings
from tests.jobs.test_celery_app import ADMIN, worker_settings

__all__ = ["worker_settings"]  # the module's Celery worker fixture

pytestmark = pytest.mark.slow  # starts a Celery worker subprocess

WORKLOAD = {
    "prompt_tokens": {"p50": 100},
    "output_tokens": {"p50": 20},
    "adapters": [{"name": "a", "rank": 8, "rate": 2.0}],
}
FAST: dict[str, Any] = {"num_samples": 8, "check_s": 3.0, "workload": WORKLOAD}
SLOW: dict[str, Any] = {"num_samples": 2000, "check_s": 600.0, "workload": WORKLOAD}
JOB_TIMEOUT_S = 300.0


def _wait_for(
    client: TestClient, settings: Settings, job_id: str, statuses: tuple[str, ...]
) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        job = client.get(f"/v1/admin/plan/{job_id}", headers=ADMIN).json()
        if job["status"] in statuses:
            return job
        time.sleep(0.2)
    worker_log = (settings.data_dir / "worker.log").read_text(errors="replace")[-6000:]
    pytest.fail(f"plan job {job_id} not {statuses} after {JOB_TIMEOUT_S}s: {job}\nworker log:\n{worker_log}")


def test_the_celery_worker_runs_a_plan_job_and_a_cancelled_one_stops(worker_settings: Settings) -> None:
    with TestClient(create_app(worker_settings)) as client:
        slow = client.post("/v1/admin/plan", json=SLOW, headers=ADMIN)
        assert slow.status_code == 202, slow.text
        _wait_for(client, worker_settings, slow.json()["id"], ("running",))
        cancelled = client.delete(f"/v1/admin/plan/{slow.json()['id']}", headers=ADMIN)
        assert cancelled.json()["status"] == "cancelled"
        # one plan at a time: this one runs only once the cancelled plan's process is gone
        fast = client.post("/v1/admin/plan", json=FAST, headers=ADMIN)
        assert fast.status_code == 202, fast.text
        done = _wait_for(client, worker_settings, fast.json()["id"], ("succeeded", "failed"))
        assert done["status"] == "succeeded", done
        assert done["result"]["object"] == "capacity_plan" and done["result"]["num_gpus"] >= 1
        assert (
            client.get(f"/v1/admin/plan/{slow.json()['id']}", headers=ADMIN).json()["status"] == "cancelled"
        )
