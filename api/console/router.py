"""Mount the console on an app: its routers, its static files (/console/static: our CSS and JS, and htmx and
Chart.js vendored from their npm packages), the answers to a missing session (a redirect to the sign-in
form for a page, 401 for a fetch) and to a forbidden page (403), and the security headers of every response
under /console (api/console/security.py)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from api.console import (
    keys_routes,
    login_routes,
    operator_routes,
    ops_routes,
    playground_routes,
    tenant_routes,
)
from api.console.auth import ConsoleForbidden, SignInRequired
from api.console.security import (
    ConsoleHeadersMiddleware,
    error_page,
    is_page_request,
    with_console_headers,
)
from api.console.templating import STATIC_DIR

ROUTERS = (
    login_routes.router,
    tenant_routes.router,
    keys_routes.router,
    playground_routes.router,
    operator_routes.router,
    ops_routes.router,
)


async def _sign_in_required(request: Request, _: Exception) -> Response:
    if is_page_request(request):
        return RedirectResponse("/console/login", status_code=303)
    return JSONResponse(
        {"error": {"type": "authentication_error", "message": "your console session ended: sign in again"}},
        status_code=401,
        headers={"HX-Redirect": "/console/login"},
    )


async def _forbidden(request: Request, exc: Exception) -> Response:
    message = exc.message if isinstance(exc, ConsoleForbidden) else "forbidden"
    if is_page_request(request):
        return error_page(request, 403, message)
    body = {"error": {"type": "permission_error", "message": message}}
    return JSONResponse(body, status_code=403)


def install_console(app: FastAPI) -> None:
    """Add the console's routes, static files, error answers and security headers to `app` (after
    api/errors.py install_error_handlers: its 500 handler is wrapped)."""
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    app.add_exception_handler(SignInRequired, _sign_in_required)
    app.add_exception_handler(ConsoleForbidden, _forbidden)
    unhandled = app.exception_handlers.get(Exception)
    if unhandled is not None:
        app.add_exception_handler(Exception, with_console_headers(unhandled))
    app.add_middleware(ConsoleHeadersMiddleware)
