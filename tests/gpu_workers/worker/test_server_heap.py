"""The worker process's uvicorn exempts its startup heap from garbage collection once the app has started
(gpu_workers/worker/server.py): a full collection would stop token streaming while it scans every import-time
object."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpu_workers.worker.server import _DrainingServer
from tests.polling import wait_for
from tests.worker_harness import serving


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_worker_server_freezes_its_startup_heap(unfrozen: None) -> None:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    runtime = SimpleNamespace(on_drained=None, is_draining=False)

    def make_server(config: Any) -> _DrainingServer:
        return _DrainingServer(config, runtime)  # type: ignore[arg-type]

    assert gc.get_freeze_count() == 0
    with serving(app, server_class=make_server) as url:
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        assert wait_for(lambda: gc.get_freeze_count() > 1000, timeout_s=30)
