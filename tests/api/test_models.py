"""GET /v1/models: OpenAI-style list of the base model and ready adapters."""

from __future__ import annotations

from tests.api.conftest import adapter_paths, upload


def test_lists_base_model_and_ready_adapters_openai_style(client, tenant, demo_adapter) -> None:
    upload(client, tenant, "my-lora", adapter_paths(demo_adapter))
    body = client.get("/v1/models", headers=tenant.headers).json()
    assert body["object"] == "list"
    base, adapter = body["data"]
    assert base == {**base, "id": "lorahost-base", "object": "model", "owned_by": "lorahost"}
    assert adapter["id"] == "my-lora" and adapter["object"] == "model" and adapter["owned_by"] == "acme"
    assert adapter["root"] == "lorahost-base" and adapter["version"] == 1 and adapter["created"] > 0


def test_failed_versions_are_not_listed(client, tenant, demo_adapter, db_session) -> None:
    from registry import repository

    upload(client, tenant, "my-lora", adapter_paths(demo_adapter))
    version = repository.resolve_model(db_session, tenant.id, "my-lora")[1]
    version.status = "failed"
    db_session.commit()
    ids = [m["id"] for m in client.get("/v1/models", headers=tenant.headers).json()["data"]]
    assert ids == ["lorahost-base"]


def test_retrieves_one_model_by_name_and_version(client, tenant, demo_adapter) -> None:
    upload(client, tenant, "my-lora", adapter_paths(demo_adapter))
    upload(client, tenant, "my-lora", adapter_paths(demo_adapter))
    assert client.get("/v1/models/my-lora", headers=tenant.headers).json()["version"] == 2
    assert client.get("/v1/models/my-lora@1", headers=tenant.headers).json()["id"] == "my-lora@1"
    assert client.get("/v1/models/lorahost-base", headers=tenant.headers).json()["owned_by"] == "lorahost"
    missing = client.get("/v1/models/nope", headers=tenant.headers)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "adapter_not_found"
