"""gpu_workers/worker/worker_service.py: what a generate request carries reaches the engine backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from cluster.protocol import GenerateRequest
from gpu_workers.engine.outputs import RequestOutput
from gpu_workers.worker.host_cache import HostAdapterCache
from gpu_workers.worker.worker_service import WorkerService
from scheduler.core.engine_request import EngineRequest
from scheduler.core.engine_stats import EngineStats


class _RecordingBackend:
    """A backend that records each generate_stream call's request and finishes at once."""

    def __init__(self) -> None:
        self.calls: list[EngineRequest] = []

    def engine_stats(self) -> EngineStats:
        return EngineStats(max_model_len=128)

    async def generate_stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        self.calls.append(request)
        now = time.time()
        yield RequestOutput(
            request.request_id, [7], "x", True, "length", request.num_prompt_tokens, 1, now, now, now
        )


def _service(tmp_path: Path, backend: _RecordingBackend) -> WorkerService:
    cache = HostAdapterCache(tmp_path / "host", lambda key, dest: None)
    return WorkerService(backend, cache, worker_id="w1", base_model="base", max_num_seqs=4)  # type: ignore[arg-type]


def test_the_tenant_and_its_fair_share_weight_reach_the_engine(tmp_path: Path) -> None:
    backend = _RecordingBackend()
    service = _service(tmp_path, backend)

    async def run(request: GenerateRequest) -> list[str]:
        prepared = await service.prepare(request)
        return [event.type async for event in service.stream(prepared)]

    weighted = GenerateRequest(request_id="r1", prompt_token_ids=[1, 2], tenant_id="t1", tenant_weight=2.5)
    assert asyncio.run(run(weighted)) == ["delta", "final"]
    assert asyncio.run(run(GenerateRequest(request_id="r2", prompt_token_ids=[1], tenant_id="t2"))) == [
        "delta",
        "final",
    ]
    assert [(c.tenant_id, c.tenant_weight) for c in backend.calls] == [("t1", 2.5), ("t2", 1.0)]


@pytest.mark.parametrize("weight", [0, -1.0, float("inf"), float("nan")])
def test_a_tenant_weight_that_is_not_positive_and_finite_is_refused(weight: float) -> None:
    with pytest.raises(ValidationError, match="tenant_weight"):
        GenerateRequest(request_id="r1", prompt_token_ids=[1], tenant_weight=weight)
