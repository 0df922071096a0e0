"""Mount the console on an app: its routers, its static files (/console/static: our CSS and JS, and htmx and
Chart.js vendored from their npm packages) and the answers to a missing session (a redirect to the sign-in
form for a page, 401 for a fetch) and to a forbidden page (403)."""

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
from api.console.security import apply_security_headers, error_page, is_page_request
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
        return apply_security_headers(RedirectResponse("/console/login", status_code=303))
    response = JSONResponse(
        {"error": {"type": "authentication_error", "message": "your console session ended: sign in again"}},
        status_code=401,
        headers={"HX-Redirect": "/console/login"},
    )
    return apply_security_headers(response)


async def _forbidden(request: Request, exc: Exception) -> Response:
    message = exc.message if isinstance(exc, ConsoleForbidden) else "forbidden"
    if is_page_request(request):
        return error_page(request, 403, message)
    body = {"error": {"type": "permission_error", "message": message}}
    return apply_security_headers(JSONResponse(body, status_code=403))


def install_console(app: FastAPI) -> None:
    """Add the console's routes, static files and error answers to `app`."""
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    app.add_exception_handler(SignInRequired, _sign_in_required)
    app.add_exception_handler(ConsoleForbidden, _forbidden)
