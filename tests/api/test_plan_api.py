"""Capacity plans are jobs: POST /v1/admin/plan checks the body (400/422 before any job row), queues a job and
answers 202; GET /v1/admin/plan/{id} follows it to the plan the planner computes; DELETE cancels it and kills
its process; a time limit fails it; the queue is bounded (429); the API answers other requests while a plan
runs; the `profile` field takes names only. Admin only.

The app here has its own SQLite file (not the test's shared connection): the runner's threads write job rows
while requests read them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.main import create_app
from api.services import Services, build_services
from jobs.plan_runner import EmbeddedPlanRunner
from registry.models import Base, PlanJob, Tenant, UsageRecord, utcnow
from settings import Settings
from tests.api.test_completions_support import add_ready_version
from twin.planner.plan_inputs import run_plan_inputs

pytestmark = pytest.mark.slow  # the planner runs the twin in a child process

ADMIN = {"Authorization": "Bearer plan-admin"}
FAST: dict[str, Any] = {"num_samples": 8, "check_s": 3.0}
SLOW: dict[str, Any] = {"num_samples": 2000, "check_s": 600.0}  # minutes of twin runs: cancelled or timed out
WORKLOAD = {
    "prompt_tokens": {"p50": 100},
    "output_tokens": {"p50": 20},
    "adapters": [{"name": "a", "rank": 8, "rate": 2.0}],
}
WAIT_S = 300.0  # generous bound on a small plan (its child process starts and imports the planner)


class PlanApp:
    """A test app with its own database, its services and a client."""

    def __init__(self, tmp_path: Path, **overrides: Any) -> None:
        values = {
            "data_dir": tmp_path,
            "database_url": f"sqlite:///{tmp_path / 'plan.db'}",
            "admin_key": "plan-admin",
            "placement_interval_s": 0.0,
            "cold_start_timeout_s": 0.0,
        } | overrides
        self.settings = Settings(**values)
        self.services: Services = build_services(self.settings)
        assert self.services.engine is not None
        Base.metadata.create_all(self.services.engine)
        self.client = TestClient(create_app(self.settings, services=self.services))
        self.client.__enter__()

    @property
    def runner(self) -> EmbeddedPlanRunner:
        runner = self.services.plan_runner
        assert isinstance(runner, EmbeddedPlanRunner)
        return runner

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post("/v1/admin/plan", json=body, headers=ADMIN)
        assert response.status_code == 202, response.text
        assert response.headers["location"] == f"/v1/admin/plan/{response.json()['id']}"
        return response.json()

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/admin/plan/{job_id}", headers=ADMIN)
        assert response.status_code == 200, response.text
        return response.json()

    def finished(self, job_id: str) -> dict[str, Any]:
        assert self.runner.wait(job_id, WAIT_S), f"job {job_id} still runs after {WAIT_S} s"
        return self.job(job_id)

    def wait_running(self, job_id: str) -> int:
        """The pid of the job's child once it started (bounded poll of the runner's state)."""
        deadline = time.monotonic() + WAIT_S
        while (pid := self.runner.child_pid(job_id)) is None:
            assert time.monotonic() < deadline, "the plan's process never started"
            time.sleep(0.05)
        return pid

    def num_jobs(self) -> int:
        with self.services.session_factory() as session:
            return int(session.scalar(select(func.count()).select_from(PlanJob)) or 0)

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        self.services.close()


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[Callable[..., PlanApp]]:
    apps: list[PlanApp] = []

    def make(**overrides: Any) -> PlanApp:
        data_dir = tmp_path / f"app{len(apps)}"
        data_dir.mkdir()
        app = PlanApp(data_dir, **overrides)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def app(make_app: Callable[..., PlanApp]) -> PlanApp:
    return make_app()


def record_demand(session: Session, tenant_id: str, version_id: str, n: int, ago_s: float = 10.0) -> None:
    """n finished requests of the version, started ago_s seconds ago (the demand the planner reads)."""
    for i in range(n):
        session.add(
            UsageRecord(
                request_id=f"{version_id}-{i}-{ago_s}", tenant_id=tenant_id, adapter_version_id=version_id,
                model_name="m", prompt_tokens=200 + i, completion_tokens=50, status="ok",
                started_at=utcnow() - timedelta(seconds=ago_s),
            )
        )  # fmt: skip
    session.commit()


WALL_TIMES = ("train_s", "wall_s", "plan_s", "twin_s", "check_s", "search_s")  # wall-clock seconds of the run


def without_wall_times(value: Any) -> Any:
    """The plan without the wall-clock seconds it reports (they differ between two runs)."""
    if isinstance(value, dict):
        return {k: without_wall_times(v) for k, v in value.items() if k not in WALL_TIMES}
    if isinstance(value, list):
        return [without_wall_times(v) for v in value]
    return value


def process_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_plan_job_from_recorded_demand_answers_what_the_planner_computes(app: PlanApp) -> None:
    with app.services.session_factory() as session:
        tenant = Tenant(name="acme")
        session.add(tenant)
        session.commit()
        hot = add_ready_version(session, tenant.id, "hot", rank=16)
        cold = add_ready_version(session, tenant.id, "cold", rank=8)
        record_demand(session, tenant.id, hot.id, 30)
        record_demand(session, tenant.id, cold.id, 3)
        record_demand(session, tenant.id, cold.id, 50, ago_s=7200.0)  # outside the window
    queued = app.submit({**FAST, "window_s": 60.0, "slo": "ttft_p99=2s"})
    assert queued["object"] == "capacity_plan_job" and queued["status"] in ("queued", "running")
    assert queued["result"] is None
    done = app.finished(queued["id"])
    assert done["status"] == "succeeded", done
    plan = done["result"]
    assert plan["object"] == "capacity_plan" and plan["window_s"] == 60.0 and plan["num_gpus"] >= 1
    rates = {a["adapter_id"]: a["rate"] for g in plan["gpus"] for a in g["adapters"]}
    assert rates == pytest.approx({hot.id: 30 / 60.0, cold.id: 3 / 60.0})
    # the job's answer is the planner's own on the stored inputs
    with app.services.session_factory() as session:
        inputs = session.get(PlanJob, queued["id"]).inputs  # type: ignore[union-attr]
    direct = run_plan_inputs(inputs, app.settings.engine, app.settings.data_dir / "planner")
    assert without_wall_times(plan) == without_wall_times(direct)


def test_a_given_workload_on_a_named_profile(app: PlanApp) -> None:
    body = {**FAST, "workload": WORKLOAD, "profile": "a100-llama3.1-8b-vllm", "baselines": True}
    done = app.finished(app.submit(body)["id"])
    assert done["status"] == "succeeded", done
    assert "A100" in done["result"]["profile"] and len(done["result"]["baselines"]) == 2
    assert done["result"]["window_s"] is None


def test_a_plan_job_with_an_slo_carries_the_search(app: PlanApp) -> None:
    body = {**FAST, "workload": WORKLOAD, "slo": "ttft_p99=2s", "max_checks": 3, "gpu_price_per_hour": 3.0}
    done = app.finished(app.submit(body)["id"])
    assert done["status"] == "succeeded", done
    search = done["result"]["search"]
    assert search["verdict"] == "meets SLO" and search["max_checks"] == 3 and search["num_checks"] <= 3
    chosen = search["chosen"]
    assert chosen["num_workers"] == 1 and chosen["cost_per_hour"] == 3.0  # 2 requests/s: one GPU
    assert chosen["margin_pct"] > 0 and chosen["measured_s"] <= 2.0 and isinstance(search["runners_up"], list)
    assert done["result"]["verdict"] == "meets SLO"
    unsearched = app.finished(app.submit({**body, "max_checks": 0})["id"])
    assert unsearched["status"] == "succeeded" and "search" not in unsearched["result"]


def test_cancelling_a_running_plan_kills_its_process(app: PlanApp) -> None:
    job = app.submit({**SLOW, "workload": WORKLOAD})
    pid = app.wait_running(job["id"])
    assert app.job(job["id"])["status"] == "running"
    cancelled = app.client.delete(f"/v1/admin/plan/{job['id']}", headers=ADMIN)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
    assert process_is_gone(pid)
    assert app.job(job["id"])["status"] == "cancelled"
    again = app.client.delete(f"/v1/admin/plan/{job['id']}", headers=ADMIN)  # idempotent
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    assert app.client.delete("/v1/admin/plan/no-such-job", headers=ADMIN).status_code == 404
    assert app.client.get("/v1/admin/plan/no-such-job", headers=ADMIN).status_code == 404


def test_a_plan_past_the_time_limit_fails_saying_so(make_app: Callable[..., PlanApp]) -> None:
    app = make_app(placement_planner_time_limit_s=0.5)
    job = app.submit({**SLOW, "workload": WORKLOAD})
    done = app.finished(job["id"])
    assert done["status"] == "failed" and "time limit" in done["error"], done


def test_the_api_answers_while_a_plan_runs(app: PlanApp) -> None:
    job = app.submit({**SLOW, "workload": WORKLOAD})
    app.wait_running(job["id"])
    assert app.client.get("/v1/health").status_code == 200
    assert app.job(job["id"])["status"] == "running"  # the plan still runs: the answer did not wait for it
    app.client.delete(f"/v1/admin/plan/{job['id']}", headers=ADMIN)


def test_the_queue_is_bounded(make_app: Callable[..., PlanApp]) -> None:
    app = make_app(placement_planner_max_running=1, placement_planner_max_queued=1)
    first = app.submit({**SLOW, "workload": WORKLOAD})
    second = app.submit({**SLOW, "workload": WORKLOAD})
    refused = app.client.post("/v1/admin/plan", json={**SLOW, "workload": WORKLOAD}, headers=ADMIN)
    assert refused.status_code == 429 and "cancel one" in refused.text and refused.headers["retry-after"]
    assert app.num_jobs() == 2
    assert app.job(second["id"])["status"] == "queued"  # one at a time
    for job in (second, first):
        app.client.delete(f"/v1/admin/plan/{job['id']}", headers=ADMIN)
    assert app.job(second["id"])["status"] == "cancelled"


def test_shutdown_ends_a_running_plan(make_app: Callable[..., PlanApp]) -> None:
    app = make_app()
    job = app.submit({**SLOW, "workload": WORKLOAD})
    pid = app.wait_running(job["id"])
    app.client.__exit__(None, None, None)  # the lifespan ends
    assert process_is_gone(pid)
    with app.services.session_factory() as session:
        row = session.get(PlanJob, job["id"])
        assert row is not None and row.status == "failed" and "server stopped" in (row.error or "")


def test_jobs_a_dead_process_left_running_are_failed_at_start(make_app: Callable[..., PlanApp]) -> None:
    app = make_app()
    with app.services.session_factory() as session:
        owner = app.settings.api.resolved_api_instance_id()
        session.add(PlanJob(inputs={}, runner="embedded", owner=owner, status="running",
                            deadline_at=utcnow() + timedelta(hours=1)))  # fmt: skip
        session.add(PlanJob(inputs={}, runner="celery", status="running", deadline_at=utcnow()))
        session.commit()
    app.client.__exit__(None, None, None)
    app.client.__enter__()  # a new start of the same API instance
    with app.services.session_factory() as session:
        statuses = {job.runner: job.status for job in session.scalars(select(PlanJob))}
    assert statuses == {"embedded": "failed", "celery": "running"}  # the celery job fails by its deadline
    assert (
        app.client.get(f"/v1/admin/plan/{_job_of(app, 'celery')}", headers=ADMIN).json()["status"] == "failed"
    )


def _job_of(app: PlanApp, runner: str) -> str:
    with app.services.session_factory() as session:
        return session.scalars(select(PlanJob.id).where(PlanJob.runner == runner)).one()


def test_plan_is_admin_only(app: PlanApp) -> None:
    # the project's admin routes answer 401 to anything but the admin key (api/deps.py require_admin)
    as_other = app.client.post("/v1/admin/plan", json=FAST, headers={"Authorization": "Bearer nope"})
    assert as_other.status_code == 401
    assert app.client.post("/v1/admin/plan", json=FAST).status_code == 401
    assert app.client.get("/v1/admin/plan/x").status_code == 401
    assert app.client.delete("/v1/admin/plan/x").status_code == 401


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
def test_bad_bodies_say_what_to_fix_and_queue_nothing(
    app: PlanApp, body: dict[str, Any], status: int, message: str
) -> None:
    response = app.client.post("/v1/admin/plan", json={**FAST, **body}, headers=ADMIN)
    assert response.status_code == status and message in response.text, response.text
    assert app.num_jobs() == 0


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "/etc/hostname", "../profiles/a100-llama3.1-8b-vllm", "/nope"]
)
def test_the_profile_field_never_reads_a_server_path(app: PlanApp, tmp_path: Path, name: str) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"version": 1, "hardware": "TOP-SECRET-VALUE"}')
    for profile in (name, str(secret)):
        body = {**FAST, "workload": WORKLOAD, "profile": profile}
        response = app.client.post("/v1/admin/plan", json=body, headers=ADMIN)
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert "name a profile, not a file" in message and "a100-llama3.1-8b-vllm" in message
        assert "TOP-SECRET" not in message and "root:" not in message and "no such" not in message
    assert app.num_jobs() == 0


def test_the_operators_configured_profile_file_goes_by_its_name(
    make_app: Callable[..., PlanApp], tmp_path: Path
) -> None:
    from twin.planner.profile_lookup import SHIPPED_DIR

    path = tmp_path / "site-gpu.json"
    path.write_text((SHIPPED_DIR / "a100-llama3.1-8b-vllm.json").read_text())
    app = make_app(placement_planner_profile=str(path))
    done = app.finished(app.submit({**FAST, "workload": WORKLOAD, "profile": "site-gpu"})["id"])
    assert done["status"] == "succeeded", done
