"""The API side of rank-aware routing: the route request carries the adapter's rank, worker records become
router views with their routing state and profile, the live listing of a shared directory is cached, and the
rank_aware policy routes real requests by it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.live_workers import cached_live_workers, live_workers
from cluster.membership import InMemoryWorkerDirectory, WorkerRecord
from cluster.protocol import EngineSummary
from cluster.worker_view import worker_view
from scheduler.core.scheduler_stats import SchedulerStats
from scheduler.routing.caraserve_router import RankAwareRouter
from scheduler.routing.perf_model import DEFAULT_PERF_MODEL, LinearLatency, PerfModel
from scheduler.routing.router import RouteRequest, WorkerView
from tests.api.conftest import TenantHandle
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, add_ready_version, usage_rows


class RecordingRouter:
    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.requests: list[RouteRequest] = []

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> str | None:
        self.requests.append(request)
        return self.inner.choose(request, workers)  # type: ignore[attr-defined]


def _complete(client: TestClient, tenant: TenantHandle, model: str):  # type: ignore[no-untyped-def]
    return client.post(
        "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 3}, headers=tenant.headers
    )


def test_the_route_request_carries_the_adapter_versions_rank(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    workers.add("w1")
    add_ready_version(db_session, tenant.id, "tuned", rank=16)
    services = client.app.state.services  # type: ignore[attr-defined]
    recorder = RecordingRouter(services.router)
    services.worker_client.router = recorder
    assert _complete(client, tenant, "tuned").status_code == 200
    assert _complete(client, tenant, BASE_MODEL).status_code == 200
    assert [r.adapter_rank for r in recorder.requests] == [16, 0]
    assert recorder.requests[0].num_prompt_tokens > 0


def _max_form_profile() -> dict:
    return PerfModel(
        prefill=LinearLatency(5.0, 0.05, 0.0005, rank_form="max", per_token=True),
        decode=LinearLatency(10.0, 1.0, 0.05, rank_form="max"),
    ).to_dict()


def test_the_rank_aware_policy_keeps_a_low_rank_request_off_the_high_rank_worker(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    version = add_ready_version(db_session, tenant.id, "small", rank=4)
    services = client.app.state.services  # type: ignore[attr-defined]
    services.worker_client.router = RankAwareRouter(slo_tpot_ms=1000.0)
    high, low = workers.add("a"), workers.add("b")
    for worker_id, worker, ranks in (("a", high, (128, 128)), ("b", low, (8, 8))):
        workers.directory.heartbeat(
            WorkerRecord(
                worker_id,
                worker.url,
                BASE_MODEL,
                max_num_seqs=8,
                perf_model=_max_form_profile(),
                scheduler=SchedulerStats(num_running=2, device_adapters=(version.id,), running_ranks=ranks),
            ),
            ttl_s=3600,
        )
    assert _complete(client, tenant, "small").status_code == 200
    assert len(low.requests) == 1 and high.requests == []


def test_an_adapter_above_every_workers_rank_limit_is_refused_with_a_400_naming_it(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    add_ready_version(db_session, tenant.id, "wide", rank=64)
    narrow, wide = workers.add("narrow"), workers.add("wide")
    for worker_id, worker, limit in (("narrow", narrow, 16), ("wide", wide, 32)):
        record = WorkerRecord(
            worker_id,
            worker.url,
            BASE_MODEL,
            max_num_seqs=8,
            engine=EngineSummary(backend="vllm", max_lora_rank=limit),
        )
        workers.directory.heartbeat(record, ttl_s=3600)
    response = _complete(client, tenant, "wide")
    assert response.status_code == 400
    assert "rank 64" in response.text and "max_lora_rank 32" in response.text
    assert narrow.requests == [] and wide.requests == []
    assert _complete(client, tenant, BASE_MODEL).status_code == 200  # the base model is served as before
    assert sorted(r.status for r in usage_rows(db_session, tenant.id)) == ["ok", "rejected"]  # once each


def test_worker_view_carries_the_routing_state_and_parses_the_profile() -> None:
    record = WorkerRecord(
        "w1",
        "http://w1",
        "base",
        perf_model=DEFAULT_PERF_MODEL.to_dict(),
        scheduler=SchedulerStats(
            num_running=1,
            running_ranks=(64,),
            waiting_ranks=(8, 0),
            num_waiting_prompt_tokens=30,
            adapter_ranks={"a": 64},
            num_free_pool_pages=5,
        ),
        engine=EngineSummary(decode_step_ms=7.0, prefill_step_ms=20.0, max_lora_rank=32),
    )
    view = worker_view(record)
    assert view.max_lora_rank == 32
    assert (view.running_ranks, view.waiting_ranks, view.num_waiting_prompt_tokens) == ((64,), (8, 0), 30)
    assert view.adapter_ranks == {"a": 64} and view.num_free_pool_pages == 5
    assert (view.decode_step_ms, view.prefill_step_ms) == (7.0, 20.0)
    assert view.perf_model == DEFAULT_PERF_MODEL
    assert (
        worker_view(record.model_copy(update={"perf_model": {"prefill": {}}})).perf_model is None
    )  # unreadable: default


class SharedDirectory:
    """A directory that is not process-local (as Redis): reads are counted."""

    def __init__(self) -> None:
        self.inner = InMemoryWorkerDirectory()
        self.num_reads = 0

    def heartbeat(self, record: WorkerRecord, ttl_s: float) -> None:
        self.inner.heartbeat(record, ttl_s)

    def remove(self, worker_id: str) -> None:
        self.inner.remove(worker_id)

    def list_live(self) -> list[WorkerRecord]:
        self.num_reads += 1
        return self.inner.list_live()


def test_a_shared_directory_is_read_through_the_cached_listing(client: TestClient) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    assert services.worker_listing.ttl_s == services.settings.resolved_worker_view_cache_s()
    directory = SharedDirectory()
    directory.heartbeat(WorkerRecord("w1", "http://w1", BASE_MODEL), ttl_s=60)
    services.worker_directory = directory
    assert (
        cached_live_workers(services.worker_directory, services.worker_listing) is None
    )  # nothing cached yet: the caller reads in a thread
    for _ in range(5):
        assert [r.worker_id for r in live_workers(services.worker_directory, services.worker_listing)] == [
            "w1"
        ]
    assert [
        r.worker_id for r in cached_live_workers(services.worker_directory, services.worker_listing) or []
    ] == ["w1"]
    assert directory.num_reads == 1


def test_an_in_process_directory_is_read_directly(client: TestClient) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    directory = InMemoryWorkerDirectory()
    services.worker_directory = directory
    directory.heartbeat(WorkerRecord("w1", "http://w1", BASE_MODEL), ttl_s=60)
    assert [
        r.worker_id for r in cached_live_workers(services.worker_directory, services.worker_listing) or []
    ] == ["w1"]
    directory.remove("w1")
    assert live_workers(services.worker_directory, services.worker_listing) == []  # no cache in embedded mode


def test_the_worker_view_cache_stays_well_under_the_heartbeat_ttl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from settings import Settings

    assert Settings(data_dir=tmp_path).resolved_worker_view_cache_s() == 0.5  # heartbeat TTL 6 s
    assert Settings(data_dir=tmp_path, worker_view_cache_s=3.0).resolved_worker_view_cache_s() == 1.5
    assert Settings(
        data_dir=tmp_path, heartbeat_interval_s=0.2
    ).resolved_worker_view_cache_s() == pytest.approx(0.15)


def test_the_rank_aware_policy_is_built_from_settings(tmp_path, db_session_factory, blob_store) -> None:  # type: ignore[no-untyped-def]
    from api.services import build_services
    from settings import Settings

    settings = Settings(
        data_dir=tmp_path,
        admin_key="x",
        router_policy="rank_aware",
        router_slo_tpot_ms=40.0,
        router_cold_fetch_ms=9.0,
    )
    services = build_services(settings, session_factory=db_session_factory, blob_store=blob_store)
    try:
        assert services.router == RankAwareRouter(slo_tpot_ms=40.0, cold_fetch_ms=9.0)
    finally:
        services.close()


def _heartbeat(workers: ScriptedWorkers, worker_id: str, backend: str) -> object:
    worker = workers.add(worker_id)
    record = WorkerRecord(
        worker_id, worker.url, BASE_MODEL, max_num_seqs=8, engine=EngineSummary(backend=backend)
    )
    workers.directory.heartbeat(record, ttl_s=3600)
    return worker


# adapters that only native workers serve: (name, add_ready_version keywords, what the 400 names)
NATIVE_ONLY = [
    ("dora", {"use_dora": True}, "DoRA"),
    ("vocab", {"target_modules": ["q_proj", "embed_tokens", "lm_head"]}, "embed_tokens / lm_head"),
]


@pytest.mark.parametrize(("name", "fields", "says"), NATIVE_ONLY, ids=[n for n, _, _ in NATIVE_ONLY])
def test_a_dora_or_vocab_lora_adapter_goes_only_to_native_workers(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    name: str,
    fields: dict[str, Any],
    says: str,
) -> None:
    add_ready_version(db_session, tenant.id, name, **fields)
    add_ready_version(db_session, tenant.id, "plain")
    vllm, native = _heartbeat(workers, "vllm", "vllm"), _heartbeat(workers, "native", "native")
    for _ in range(4):
        assert _complete(client, tenant, name).status_code == 200
    assert len(native.requests) == 4 and vllm.requests == []  # type: ignore[attr-defined]
    for _ in range(6):  # plain LoRA may still go to either
        assert _complete(client, tenant, "plain").status_code == 200
    assert len(native.requests) + len(vllm.requests) == 10  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "fields", "says"), NATIVE_ONLY, ids=[n for n, _, _ in NATIVE_ONLY])
def test_a_dora_or_vocab_lora_adapter_with_only_vllm_workers_is_refused_with_a_400_saying_why(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    name: str,
    fields: dict[str, Any],
    says: str,
) -> None:
    add_ready_version(db_session, tenant.id, name, **fields)
    vllm = _heartbeat(workers, "vllm", "vllm")
    response = _complete(client, tenant, name)
    assert response.status_code == 400
    assert says in response.text and "vllm" in response.text and "native" in response.text
    assert vllm.requests == []  # type: ignore[attr-defined]
    add_ready_version(db_session, tenant.id, "plain")
    assert _complete(client, tenant, "plain").status_code == 200  # plain LoRA is served there as before
