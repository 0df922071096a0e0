"""Response headers of every console page: a strict Content-Security-Policy (scripts and styles from this
origin only, no inline code, no eval; the vendored htmx and Chart.js need neither), no framing, no sniffing,
no caching of pages that hold tenant data. A page navigation that hits an API or registry error gets the
error as a page (fetches and htmx requests keep the API's JSON error)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response

from api.console.templating import render
from api.errors import ApiError, registry_status
from api.request_text import TextCheckedRoute
from registry.errors import RegistryError

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


def is_page_request(request: Request) -> bool:
    """A browser navigation or form post (HTML wanted), not htmx or a fetch of JSON or a stream."""
    if "HX-Request" in request.headers:
        return False
    return request.method == "GET" or "text/html" in request.headers.get("accept", "")


def error_page(request: Request, status_code: int, message: str) -> Response:
    """An error as a console page (no user menu: it may be the session that failed)."""
    return apply_security_headers(render(request, "error.html", None, status_code, message=message))


class ConsoleRoute(TextCheckedRoute):
    """An APIRoute whose responses all carry the console's security headers, and whose page navigations show
    an API or registry error as a page."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, wrapped to add the headers."""
        handler = super().get_route_handler()

        async def secured(request: Request) -> Response:
            try:
                return apply_security_headers(await handler(request))
            except (ApiError, RegistryError) as exc:
                if not is_page_request(request):
                    raise
                status = exc.status_code if isinstance(exc, ApiError) else registry_status(exc)
                return error_page(request, status, exc.message)

        return secured
