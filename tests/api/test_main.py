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
