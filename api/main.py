"""The FastAPI app factory. `create_app(settings)` builds everything from settings in the lifespan.

Extensible: later features add routers (`routers=`) and services (`services.extras`, `app.state`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from api.errors import install_error_handlers
from api.routes import adapters, admin, health, models
from api.services import Services, build_services
from registry.settings import Settings

DEFAULT_ROUTERS: tuple[APIRouter, ...] = (health.router, admin.router, adapters.router, models.router)


def create_app(
    settings: Settings,
    *,
    services: Services | None = None,
    routers: Sequence[APIRouter] = DEFAULT_ROUTERS,
    extra_routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """The API app. Services are built from `settings` at startup unless passed in (tests, embedding)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = services is None
        app.state.services = services or build_services(settings)
        try:
            yield
        finally:
            if owned:
                app.state.services.close()

    app = FastAPI(title="lorahost", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    install_error_handlers(app)
    for router in (*routers, *extra_routers):
        app.include_router(router)
    return app
