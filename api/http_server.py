"""How an API process is served: uvicorn with the app, the bind address and which proxies' forwarded headers to
trust. Every entry point that runs the API (`lorahost serve`, `lorahost api`, the dev cluster's and the Helm
chart's `lorahost api`) goes through here, so uvicorn's own default (trust X-Forwarded-For/-Proto from
127.0.0.1, or from FORWARDED_ALLOW_IPS in the environment) never applies: forwarded headers count only from
settings.api.forwarded_allow_ips, and by default from nobody.

Once the app has started, the objects alive then (imports, the app, its services: ~220,000) are moved out of the
garbage collector's reach (`gc.freeze`), and from then on what each collection keeps
(api/serving_heap.py): a full collection scanned them all with the event loop stopped, ~90 ms for the startup heap
every few hundred requests (the p99 of every list call), 55-217 ms for the objects of 1,000 streams (the p99 of
TTFT at 2,000 streams; benchmarks/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from api.serving_heap import ServingHeap
from settings import Settings


def proxy_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's proxy settings: ProxyHeadersMiddleware only when some proxy is trusted, and then only those."""
    trusted = list(settings.api.forwarded_allow_ips)
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted}


def api_server_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The uvicorn configuration of an API process (settings.api.host/port, trusted proxies, whether each request
    is access-logged: settings.api.is_access_logged)."""
    return uvicorn.Config(
        app,
        host=settings.api.host,
        port=settings.api.port,
        access_log=settings.api.is_access_logged,
        **proxy_options(settings),
    )


class HeapFreezingServer(uvicorn.Server):
    """uvicorn that starts the process's ServingHeap once the app's lifespan has started (the startup heap frozen,
    then what each full collection keeps) and tends it on the event loop while it serves."""

    def __init__(self, config: uvicorn.Config, heap: ServingHeap | None = None) -> None:
        super().__init__(config)
        self.heap = heap or ServingHeap()
        self._tending: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, then the heap started and tended."""
        await super().startup(sockets)
        if not self.should_exit:
            self.heap.start()
            self._tending = asyncio.create_task(self.heap.tend())

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop tending the heap, then uvicorn's shutdown."""
        if self._tending is not None:
            self._tending.cancel()
        self.heap.stop()
        await super().shutdown(sockets)


def serve_api(app: Any, settings: Settings, *, has_engine: bool = False) -> None:
    """Serve `app` until the process is told to stop (SIGINT/SIGTERM), as uvicorn.run does (exit status 3 when
    it cannot start), with the options of api_server_config and the process's ServingHeap (which freezes only
    the startup heap when the process also runs an engine: `has_engine`)."""
    heap = ServingHeap(is_freezing_promoted=not has_engine)
    app.state.serving_heap = heap  # the app's metrics read its collections' pauses (api/main.py)
    server = HeapFreezingServer(api_server_config(app, settings), heap)
    server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
