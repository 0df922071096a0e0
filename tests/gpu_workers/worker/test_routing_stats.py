"""What a worker publishes for the rank-aware router: adapter ranks, running/waiting ranks, queued prompt tokens,
recent step times (engine stats), and the WorkerStats / heartbeat record built from them with the profile."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster.membership import WorkerRecord
from cluster.worker_view import worker_view
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.worker import builder
from gpu_workers.worker.builder import BACKENDS, build_worker_service, make_runtime
from gpu_workers.worker.host_cache import HostAdapterCache
from gpu_workers.worker.worker_service import WorkerService
from registry.storage import LocalBlobStore
from scheduler.core.engine_request import EngineRequest
from scheduler.core.engine_stats import EngineStats
from scheduler.core.sampling import SamplingParams
from scheduler.core.scheduler_stats import SchedulerStats
from scheduler.routing.perf_model import DEFAULT_PERF_MODEL, PerfModel
from settings import Settings

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
DEMO_RANKS = {"adapter-00": 4, "adapter-01": 8, "adapter-02": 16, "adapter-03": 32, "adapter-04": 2}


def test_engine_stats_publish_ranks_queue_tokens_and_recent_step_times(
    make_engine: Callable[..., LLMEngine],
) -> None:
    engine = make_engine()
    stats = engine.engine_stats()
    assert stats.adapter_ranks == DEMO_RANKS
    assert stats.decode_step_ms is None and stats.prefill_step_ms is None
    engine.add_request(EngineRequest("r32", [1, 5, 6, 7, 8], GREEDY, "adapter-03"))
    engine.add_request(EngineRequest("r4", [1, 5, 6], GREEDY, "adapter-00"))
    engine.add_request(EngineRequest("base", [1, 9], GREEDY))
    stats = engine.engine_stats()
    assert sorted(stats.waiting_ranks) == [0, 4, 32] and stats.running_ranks == ()
    assert stats.num_waiting_by_tenant == {"": 3}  # no tenant given: fair share's anonymous tenant
    assert stats.num_waiting_prompt_tokens == 5 + 3 + 2
    engine.step()  # the prefill of all three
    stats = engine.engine_stats()
    assert sorted(stats.running_ranks) == [0, 4, 32] and stats.waiting_ranks == ()
    assert stats.num_waiting_by_tenant == {}
    assert stats.num_waiting_prompt_tokens == 0
    assert stats.prefill_step_ms is not None and stats.prefill_step_ms > 0 and stats.decode_step_ms is None
    engine.step()
    decode_step_ms = engine.engine_stats().decode_step_ms
    assert decode_step_ms is not None and decode_step_ms > 0
    for request_id in ("r32", "r4", "base"):
        engine.abort(request_id)
    engine.step()
    assert engine.engine_stats().running_ranks == ()


class _StatsBackend:
    """Only what WorkerService.stats reads: the engine's stats."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self._stats = EngineStats.model_validate(stats)

    def engine_stats(self) -> EngineStats:
        return self._stats

    def device_adapters(self) -> list[str]:
        return list(self._stats.device_adapters)


def _service(tmp_path: Path, stats: dict[str, Any], perf_model: dict[str, Any] | None) -> WorkerService:
    cache = HostAdapterCache(tmp_path / "host", lambda key, dest: None)
    return WorkerService(
        _StatsBackend({"max_model_len": 128, **stats}),  # type: ignore[arg-type]
        cache,
        worker_id="w1",
        base_model="base",
        max_num_seqs=8,
        perf_model=perf_model,
    )


def test_worker_stats_and_the_heartbeat_record_carry_the_routing_state(tmp_path: Path) -> None:
    engine_stats = {
        "num_running": 2,
        "num_waiting": 1,
        "device_adapters": ["a"],
        "num_free_pool_pages": 7,
        "adapter_ranks": {"a": 64, "b": 8},
        "running_ranks": [64, 0],
        "waiting_ranks": [8],
        "num_waiting_prompt_tokens": 40,
        "num_waiting_by_queue": [1, 0],
        "num_waiting_by_tenant": {"t1": 1},
        "decode_step_ms": 12.5,
        "prefill_step_ms": 30.0,
    }
    service = _service(tmp_path, engine_stats, DEFAULT_PERF_MODEL.to_dict())
    stats = service.stats()
    core = stats.scheduler
    assert core.adapter_ranks == {"a": 64, "b": 8}
    assert (core.running_ranks, core.waiting_ranks) == ((64, 0), (8,))
    assert core.num_waiting_prompt_tokens == 40 and core.num_waiting_by_queue == (1, 0)
    assert (stats.engine.decode_step_ms, stats.engine.prefill_step_ms) == (12.5, 30.0)
    record = WorkerRecord.from_json(service.record("http://w1").to_json())  # what the API reads from Redis
    assert record.scheduler.running_ranks == (64, 0) and record.scheduler.waiting_ranks == (8,)
    assert record.scheduler.adapter_ranks == {"a": 64, "b": 8} and record.scheduler.num_free_pool_pages == 7
    assert record.engine.decode_step_ms == 12.5
    assert core.num_waiting_by_tenant == {"t1": 1} and record.scheduler.num_waiting_by_tenant == {"t1": 1}
    assert worker_view(record).num_waiting_by_tenant == {"t1": 1}  # what the router reads
    assert PerfModel.from_dict(record.perf_model or {}) == DEFAULT_PERF_MODEL


def _non_default(name: str, default: Any) -> Any:
    """A value of the default's type that differs from it (distinct per field name where it can)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return default + len(name)
    if isinstance(default, str):
        return name
    if isinstance(default, tuple):
        return ("a",) if "adapters" in name else (len(name),)
    return {"a": len(name)}


def test_every_core_stat_reaches_the_workers_stats_and_its_record(tmp_path: Path) -> None:
    """No per-field mapping between the core and the heartbeat: a field added to SchedulerStats is published."""
    fields = SchedulerStats.model_fields.items()
    values = {n: _non_default(n, f.get_default(call_default_factory=True)) for n, f in fields}
    core = SchedulerStats(**values)
    service = _service(tmp_path, core.model_dump(mode="json"), None)
    record = WorkerRecord.from_json(service.record("http://w1").to_json())
    assert service.stats().scheduler == core and record.scheduler == core


def test_a_backend_without_routing_stats_publishes_the_defaults(tmp_path: Path) -> None:
    stats = _service(tmp_path, {"num_running": 1}, None).stats()
    core = stats.scheduler
    assert core.running_ranks == () and core.adapter_ranks == {} and stats.perf_model is None
    assert stats.engine.decode_step_ms is None and core.num_waiting_by_queue == ()
    assert core.num_waiting_by_tenant == {}  # the router then uses the tenant-blind load


class _Backend:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def engine_stats(self) -> EngineStats:
        return EngineStats(max_model_len=128)


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    return Settings(
        data_dir=tmp_path,
        blob_store=str(tmp_path / "blobs"),
        base_model_path=tmp_path / "model",
        internal_token="t",
        **overrides,
    )


def test_the_worker_profile_setting_is_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builder, "BACKENDS", {**BACKENDS, "fake": _Backend})
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(DEFAULT_PERF_MODEL.to_dict()))
    service = build_worker_service(
        _settings(tmp_path, worker_backend="fake", worker_profile_path=path),
        blobs=LocalBlobStore(tmp_path / "blobs"),
        worker_id="w",
    )
    assert service.perf_model == DEFAULT_PERF_MODEL.to_dict()


@pytest.mark.parametrize("content", [None, "{not json", '{"prefill": {}}'])
def test_an_unreadable_profile_is_refused_before_the_worker_starts(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with pytest.raises(ValueError, match=r"cannot use the worker profile.*lorahost profile --output"):
            make_runtime(
                _settings(tmp_path, worker_profile_path=path), sock, None, "t", blobs=LocalBlobStore(tmp_path)
            )


def test_engine_stats_publish_the_queued_requests_per_tenant(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine(max_num_seqs=1)
    for request_id, tenant in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("a3", "a")):
        engine.add_request(EngineRequest(request_id, [1, 5, 6], GREEDY, tenant_id=tenant))
    assert engine.engine_stats().num_waiting_by_tenant == {"a": 3, "b": 1}
    engine.step()  # one of them runs (one slot)
    assert sum(engine.engine_stats().num_waiting_by_tenant.values()) == engine.engine_stats().num_waiting == 3
    for request_id in ("a1", "a2", "b1", "a3"):
        engine.abort(request_id)
