"""How an API process is served: uvicorn with the app, the bind address and which proxies' forwarded headers to
trust. Every entry point that runs the API (`lorahost serve`, `lorahost api`, the dev cluster's and the Helm
chart's `lorahost api`) goes through here, so uvicorn's own default (trust X-Forwarded-For/-Proto from
127.0.0.1, or from FORWARDED_ALLOW_IPS in the environment) never applies: forwarded headers count only from
settings.api.forwarded_allow_ips, and by default from nobody.
"""

from __future__ import annotations

from typing import Any

import uvicorn

from settings import Settings


def proxy_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's proxy settings: ProxyHeadersMiddleware only when some proxy is trusted, and then only those."""
    trusted = list(settings.api.forwarded_allow_ips)
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted}


def api_server_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The uvicorn configuration of an API process (settings.api.host/port, trusted proxies)."""
    return uvicorn.Config(app, host=settings.api.host, port=settings.api.port, **proxy_options(settings))


def serve_api(app: Any, settings: Settings) -> None:
    """Serve `app` until the process is told to stop (SIGINT/SIGTERM), as uvicorn.run does (exit status 3 when
    it cannot start), with the options of api_server_config."""
    uvicorn.run(app, host=settings.api.host, port=settings.api.port, **proxy_options(settings))
