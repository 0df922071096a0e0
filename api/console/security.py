"""Response headers of every console page: a strict Content-Security-Policy (scripts and styles from this
origin only, no inline code, no eval; the vendored htmx and Chart.js need neither), no framing, no sniffing,
no caching of pages that hold tenant data."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def apply_security_headers(response: Response) -> Response:
    """Set the console's security headers (a header the route set itself is kept)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


class ConsoleRoute(APIRoute):
    """An APIRoute whose responses all carry the console's security headers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, wrapped to add the headers."""
        handler = super().get_route_handler()

        async def secured(request: Request) -> Response:
            return apply_security_headers(await handler(request))

        return secured
