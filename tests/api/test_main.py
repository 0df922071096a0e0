"""create_app: OpenAPI, extensibility (extra routers, services on app.state)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.testclient import TestClient

from api.main import create_app
from api.services import build_services


def test_openapi_lists_the_v1_routes(client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/adapters", "/v1/models", "/v1/admin/tenants", "/v1/admin/keys/{key_id}"} <= set(paths)


def test_extra_routers_and_app_state_are_available(tmp_path, db_session_factory, blob_store) -> None:
    from settings import Settings

    router = APIRouter()

    @router.get("/v1/ping")
    def ping(request: Request) -> dict[str, str]:
        return {"pong": request.app.state.greeting}

    settings = Settings(data_dir=tmp_path, admin_key="x")
    services = build_services(settings, session_factory=db_session_factory, blob_store=blob_store)
    app = create_app(settings, services=services, extra_routers=[router])
    app.state.greeting = "hi"
    with TestClient(app) as client:
        assert client.get("/v1/ping").json() == {"pong": "hi"}


def test_app_builds_its_own_services_from_settings(tmp_path) -> None:
    from migrations.runner import upgrade
    from settings import Settings

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'own.db'}", admin_key="x")
    upgrade(settings.resolved_database_url())
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/health").json() == {"status": "ok"}
        assert client.get("/v1/admin/tenants", headers={"Authorization": "Bearer x"}).json()["data"] == []


def test_a_published_worker_transport_is_handed_to_the_worker_client(
    tmp_path, db_session_factory, blob_store
) -> None:
    """Embedded mode: `lorahost serve` publishes the in-process worker's transport in services.worker_transport."""
    from settings import Settings

    class FakeLocalTransport:
        def serves(self, worker) -> bool:
            return False

        async def open_stream(self, request):
            raise AssertionError("not called")

    settings = Settings(data_dir=tmp_path, admin_key="x")
    services = build_services(settings, session_factory=db_session_factory, blob_store=blob_store)
    transport = FakeLocalTransport()
    services.worker_transport = transport
    with TestClient(create_app(settings, services=services)):
        assert services.worker_client is not None and services.worker_client.local is transport
    assert services.worker_client is None


def test_every_route_is_matched_by_its_own_path_first(tmp_path) -> None:
    """Routes are tried in order (the inference routes first, api/main.py): no route may take another's
    requests, whatever the order."""
    from starlette.routing import Match, Route

    from settings import Settings

    app = create_app(Settings(data_dir=tmp_path, admin_key="x"))
    routes = [r for r in app.router.routes if isinstance(r, Route) and r.methods]
    v1_paths = [r.path for r in routes if r.path.startswith("/v1/")]
    assert v1_paths[:3] == ["/v1/completions", "/v1/chat/completions", "/v1/adapters/{name}/completions"]
    for route in routes:
        path = route.path_format
        for name in route.param_convertors:
            path = path.replace("{" + name + "}", "some-name")
        for method in sorted(route.methods or ()):
            scope = {"type": "http", "path": path, "method": method, "root_path": ""}
            first = next(r for r in app.router.routes if r.matches(scope)[0] is Match.FULL)
            assert first is route, f"{method} {path} is matched by {getattr(first, 'path', first)}"
