"""How an API process is served: uvicorn with the app, the bind address and which proxies' forwarded headers to
trust. Every entry point that runs the API (`lorahost serve`, `lorahost api`, the dev cluster's and the Helm
chart's `lorahost api`) goes through here, so uvicorn's own default (trust X-Forwarded-For/-Proto from
127.0.0.1, or from FORWARDED_ALLOW_IPS in the environment) never applies: forwarded headers count only from
settings.api.forwarded_allow_ips, and by default from nobody.

Once the app has started, the objects alive then (imports, the app, its services: ~220,000) are moved out of the
garbage collector's reach (`gc.freeze`): a full collection scanned them all, ~90 ms with the event loop stopped,
every few hundred requests, which was the p99 of every list call (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import gc
import socket
import sys
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from settings import Settings


def proxy_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's proxy settings: ProxyHeadersMiddleware only when some proxy is trusted, and then only those."""
    trusted = list(settings.api.forwarded_allow_ips)
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted}


def api_server_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The uvicorn configuration of an API process (settings.api.host/port, trusted proxies)."""
    return uvicorn.Config(app, host=settings.api.host, port=settings.api.port, **proxy_options(settings))


def freeze_startup_heap() -> None:
    """Collect the garbage of startup, then exempt every object alive now from later collections (they live as
    long as the process; a full collection would scan them all with the event loop stopped)."""
    gc.collect()
    gc.freeze()


class HeapFreezingServer(uvicorn.Server):
    """uvicorn that freezes the startup heap once the app's lifespan has started (freeze_startup_heap)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, then freeze_startup_heap."""
        await super().startup(sockets)
        if not self.should_exit:
            freeze_startup_heap()


def serve_api(app: Any, settings: Settings) -> None:
    """Serve `app` until the process is told to stop (SIGINT/SIGTERM), as uvicorn.run does (exit status 3 when
    it cannot start), with the options of api_server_config and the startup heap frozen."""
    server = HeapFreezingServer(api_server_config(app, settings))
    server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
