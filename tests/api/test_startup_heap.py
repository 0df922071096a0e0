"""A served API process exempts its startup heap from garbage collection once the app has started
(api/http_server.py), so a full collection does not scan every import-time object with the event loop stopped."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI

from api.http_server import HeapFreezingServer
from tests.polling import wait_for
from tests.worker_harness import serving


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test process collects as before


def _app(started: list[object]) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started.append(object())
        assert gc.get_freeze_count() == 0  # nothing frozen before the app's own startup has run
        yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    return app


def test_the_heap_alive_once_the_app_started_is_frozen_and_requests_are_served(unfrozen: None) -> None:
    started: list[object] = []
    with serving(_app(started), server_class=HeapFreezingServer) as url:
        # frozen right after uvicorn reports started (the collection before the freeze takes a while)
        assert started and wait_for(
            lambda: gc.get_freeze_count() > 1000, timeout_s=30
        )  # the imports and the app
        assert httpx.get(f"{url}/ping").json() == {"ok": True}


def test_a_plain_server_freezes_nothing(unfrozen: None) -> None:
    with serving(_app([])) as url:
        assert httpx.get(f"{url}/ping").json() == {"ok": True}
        assert gc.get_freeze_count() == 0
