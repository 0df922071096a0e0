"""Cold starts are held, not refused: a request with no ready worker for its base model waits for one
(bounded by cold_start_timeout_s), a client that leaves while waiting is metered aborted once, and
/v1/ready says whether each base model has a ready worker."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session

from api.cold_start import FULL_RATE_S, MAX_POLL_INTERVAL_S, ColdStartTimeout, ColdStartWait, poll_interval_s
from cluster.membership import WorkerRecord
from cluster.model_refusals import ModelRefusal
from settings import Settings
from tests.api import asgi_support
from tests.api.conftest import ADMIN_KEY, TenantHandle
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, usage_rows


def _scripted(client: TestClient) -> ScriptedWorkers:
    workers = ScriptedWorkers()
    workers.install(client)
    return workers


def _once_waiting(
    client: TestClient, action: Callable[[], object], timeout_s: float = 60
) -> threading.Thread:
    """Run `action` on a thread as soon as a request is in the cold-start wait (the API's gauge says so), so
    the action provably happens while the request waits, not before it got there."""
    registry = client.app.state.services.metrics.registry  # type: ignore[attr-defined]

    def run() -> None:
        deadline = time.monotonic() + timeout_s
        labels = {"base_model": BASE_MODEL}
        while not registry.get_sample_value("lorahost_cold_start_waiting_requests", labels):
            if time.monotonic() > deadline:
                return  # the request never waited: the test's own assertions say so
            time.sleep(0.01)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _complete(client: TestClient, tenant: TenantHandle) -> Any:
    body = {"model": BASE_MODEL, "prompt": "hello world", "max_tokens": 3}
    return client.post("/v1/completions", json=body, headers=tenant.headers)


def _cold_start_waits(client: TestClient) -> float:
    text = client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    for family in text_string_to_metric_families(text):
        if family.name == "lorahost_cold_start_wait_seconds":
            return sum(s.value for s in family.samples if s.name.endswith("_count"))
    return 0.0


def test_request_before_any_worker_waits_for_one_and_succeeds(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    client = make_client(cold_start_timeout_s=60)
    tenant = new_tenant("early")
    workers = _scripted(client)
    arrival = _once_waiting(client, lambda: workers.add("w-late"))
    response = _complete(client, tenant)
    arrival.join()
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3
    assert len(workers.workers["w-late.workers.test"].requests) == 1
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens, row.worker_id) == ("ok", 3, "w-late")
    assert _cold_start_waits(client) == 1


def test_worker_still_loading_holds_the_request_until_it_is_ready(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    client = make_client(cold_start_timeout_s=60)
    tenant = new_tenant("loading")
    workers = _scripted(client)
    worker = workers.add("w-loading")
    loading = WorkerRecord("w-loading", worker.url, BASE_MODEL, max_num_seqs=8, is_ready=False)
    workers.directory.heartbeat(loading, ttl_s=3600)
    assert client.get("/v1/ready").status_code == 503
    ready = WorkerRecord("w-loading", worker.url, BASE_MODEL, max_num_seqs=8, is_ready=True)
    arrival = _once_waiting(client, lambda: workers.directory.heartbeat(ready, ttl_s=3600))
    response = _complete(client, tenant)
    arrival.join()
    assert response.status_code == 200, response.text
    assert len(worker.requests) == 1  # not sent to the worker before it was ready
    assert [r.status for r in usage_rows(db_session, tenant.id)] == ["ok"]


def test_wait_past_the_timeout_is_a_503_with_retry_after_metered_once(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    client = make_client(cold_start_timeout_s=0.4)
    tenant = new_tenant("late")
    _scripted(client)
    started = time.monotonic()
    response = _complete(client, tenant)
    assert time.monotonic() - started >= 0.4  # it waited before refusing
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert "became ready within 0.4 s" in response.json()["error"]["message"]
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("rejected", 0, 0)
    assert _cold_start_waits(client) == 1


def test_refusing_workers_put_the_request_back_to_waiting_within_the_deadline(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    client = make_client(cold_start_timeout_s=60)
    tenant = new_tenant("draining")
    workers = _scripted(client)
    draining = workers.add("w-draining", status_code=503, error_type="draining")
    arrival = _once_waiting(
        client, lambda: workers.add("w-new", num_running=1)
    )  # more loaded: chosen only after
    response = _complete(client, tenant)
    arrival.join()
    assert response.status_code == 200, response.text
    assert draining.requests and len(workers.workers["w-new.workers.test"].requests) == 1
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.worker_id) == ("ok", "w-new")


def test_client_that_leaves_while_waiting_is_metered_aborted_once_with_zero_tokens(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    client = make_client(cold_start_timeout_s=60)
    tenant = new_tenant("leaver")
    _scripted(client)
    body = json.dumps({"model": BASE_MODEL, "prompt": "hello world", "max_tokens": 3}).encode()
    headers = {**tenant.headers, "content-type": "application/json"}
    registry = client.app.state.services.metrics.registry  # type: ignore[attr-defined]
    labels = {"base_model": BASE_MODEL}

    async def leave() -> None:  # the client leaves once its request is in the cold-start wait (the gauge)
        deadline = time.monotonic() + 30
        while not registry.get_sample_value("lorahost_cold_start_waiting_requests", labels):
            assert time.monotonic() < deadline, "the request never reached the cold-start wait"
            await anyio.sleep(0.01)

    exchange = asgi_support.run(client, "/v1/completions", headers, [body], leave=leave)
    assert exchange.status == 499
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("aborted", 0, 0)
    assert _cold_start_waits(client) == 1


def test_a_model_whose_worker_can_never_start_is_refused_at_once_saying_what_to_change(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    client = make_client(
        cold_start_timeout_s=3600
    )  # a refusal that waited for the timeout would hang the test
    tenant = new_tenant("too-big")
    _scripted(client)
    refusals = client.app.state.services.model_refusals  # type: ignore[attr-defined]
    message = "base model too large for the budget; raise LORAHOST_WORKER_EMBEDDED_MEMORY_BYTES"
    arrival = _once_waiting(
        client, lambda: refusals.replace({BASE_MODEL: ModelRefusal(message, is_final=True)})
    )
    response = _complete(client, tenant)
    arrival.join()
    assert response.status_code == 503 and "retry-after" not in response.headers  # retrying does not help
    assert response.json()["error"]["message"] == message
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("rejected", 0, 0)


def test_a_model_waiting_for_memory_says_so_when_its_wait_ends(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle]
) -> None:
    client = make_client(cold_start_timeout_s=0.3)
    tenant = new_tenant("waits")
    _scripted(client)
    refusals = client.app.state.services.model_refusals  # type: ignore[attr-defined]
    refusals.replace({BASE_MODEL: ModelRefusal("waits for memory: busy models", is_final=False)})
    response = _complete(client, tenant)
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert "waits for memory: busy models" in response.json()["error"]["message"]


def test_ready_route_reports_each_base_model(make_client: Callable[..., TestClient]) -> None:
    client = make_client()
    workers = _scripted(client)
    response = client.get("/v1/ready")
    assert response.status_code == 503
    assert response.json() == {
        "status": "waiting_for_workers",
        "base_models": {BASE_MODEL: {"num_ready_workers": 0}},
    }
    workers.add("w1")
    workers.add("w-other", base_model="some-other-model")
    response = client.get("/v1/ready")
    assert response.status_code == 200
    assert response.json()["base_models"] == {BASE_MODEL: {"num_ready_workers": 1}}


def test_wait_object_times_out_without_polling_forever(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, cold_start_timeout_s=0.2, cold_start_poll_interval_s=0.05)

    async def never_disconnect() -> dict[str, str]:
        await anyio.sleep(3600)
        return {"type": "http.disconnect"}

    calls: list[int] = []

    async def no_workers() -> list[WorkerRecord]:
        calls.append(1)
        return []

    async def run() -> None:
        wait = ColdStartWait(settings, BASE_MODEL, never_disconnect)
        try:
            await wait.ready_records(no_workers)
        except ColdStartTimeout:
            assert wait.has_waited and wait.waited_s() >= 0.2
            return
        raise AssertionError("the wait did not time out")

    anyio.run(run)
    assert 2 <= len(calls) <= 20  # polled at the interval, bounded by the timeout


@given(
    configured=st.floats(min_value=0.001, max_value=5.0),
    waited=st.floats(min_value=0.0, max_value=3600.0),
    later=st.floats(min_value=0.0, max_value=3600.0),
)
def test_a_long_wait_polls_less_often_but_at_least_once_a_second(
    configured: float, waited: float, later: float
) -> None:
    interval = poll_interval_s(configured, waited)
    assert configured <= interval <= max(configured, MAX_POLL_INTERVAL_S)
    if waited < FULL_RATE_S:
        assert interval == configured  # the first second at the configured rate
    assert poll_interval_s(configured, waited + later) >= interval  # never more often as the wait goes on


def test_held_requests_retrying_a_dead_worker_log_one_warning_per_worker_per_period(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api import worker_client

    now = [1000.0]
    monkeypatch.setattr(worker_client.time, "monotonic", lambda: now[0])
    client = worker_client.WorkerClient(httpx.MockTransport(lambda _: httpx.Response(503)), None)
    with caplog.at_level(logging.DEBUG, logger=worker_client.__name__):
        for i in range(50):  # 50 held requests retry the dead worker within one period
            client._warn_unavailable("w-dead", f"request r{i}: worker w-dead unreachable")
        client._warn_unavailable("w-other", "request r0: worker w-other unreachable")
        now[0] += worker_client.WARN_EVERY_S
        client._warn_unavailable("w-dead", "request r50: worker w-dead unreachable")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(" (")[0] for w in warnings] == [
        "request r0: worker w-dead unreachable",
        "request r0: worker w-other unreachable",
        "request r50: worker w-dead unreachable",
    ]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 49  # nothing is dropped, only lowered
