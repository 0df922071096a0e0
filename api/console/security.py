"""Response headers of every console response: a strict Content-Security-Policy (scripts and styles from this
origin only, no inline code, no eval; the vendored htmx and Chart.js need neither), no framing, no sniffing,
no caching of pages that hold tenant data. `ConsoleHeadersMiddleware` sets them on every response under
/console (pages, static files, redirects, 4xx, 405s) and `with_console_headers` on its 500s (sent from outside
the middleware). A page navigation that hits an API or registry error gets the error as a page (fetches and
htmx requests keep the API's JSON error)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
CONSOLE_PREFIX = "/console"
STATIC_PREFIX = "/console/static/"
# Our CSS and JS and the vendored libraries hold no tenant data: a browser may keep them if it revalidates
# (ETag / Last-Modified) instead of fetching htmx and Chart.js again on every page.
STATIC_CACHE_CONTROL = "no-cache"


def is_console_path(path: str) -> bool:
    """True for /console and everything under it."""
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


def _set_missing_headers(headers: MutableHeaders, path: str) -> None:
    if path.startswith(STATIC_PREFIX):
        headers.setdefault("Cache-Control", STATIC_CACHE_CONTROL)
    for name, value in SECURITY_HEADERS.items():
        headers.setdefault(name, value)


class ConsoleHeadersMiddleware:
    """ASGI middleware: every HTTP response under /console gets the console's security headers (a header the
    response set itself is kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to its response's start message."""
        if scope["type"] != "http" or not is_console_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        path = scope["path"]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                _set_missing_headers(MutableHeaders(scope=message), path)
            await send(message)

        await self.app(scope, receive, send_with_headers)


ExceptionHandler = Callable[[Request, Any], Response | Awaitable[Response]]


def with_console_headers(handler: ExceptionHandler) -> Callable[[Request, Exception], Awaitable[Response]]:
    """An exception handler whose responses to /console requests carry the console's headers (for the 500
    handler, which Starlette calls outside every middleware)."""

    async def handle(request: Request, exc: Exception) -> Response:
        result = handler(request, exc)
        response = await result if inspect.isawaitable(result) else result
        if is_console_path(request.url.path):
            _set_missing_headers(response.headers, request.url.path)
        return response

    return handle


def is_page_request(request: Request) -> bool:
    """A browser navigation or form post (HTML wanted), not htmx or a fetch of JSON or a stream."""
    if "HX-Request" in request.headers:
        return False
    return request.method == "GET" or "text/html" in request.headers.get("accept", "")


def error_page(request: Request, status_code: int, message: str) -> Response:
    """An error as a console page (no user menu: it may be the session that failed)."""
    return render(request, "error.html", None, status_code, message=message)


class ConsoleRoute(TextCheckedRoute):
    """An APIRoute whose page navigations show an API or registry error as a page, and whose parameters and
    bodies are checked for valid text (api/request_text.py)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, wrapped to turn errors into pages."""
        handler = super().get_route_handler()

        async def secured(request: Request) -> Response:
            try:
                return await handler(request)
            except (ApiError, RegistryError) as exc:
                if not is_page_request(request):
                    raise
                status = exc.status_code if isinstance(exc, ApiError) else registry_status(exc)
                return error_page(request, status, exc.message)

        return secured
