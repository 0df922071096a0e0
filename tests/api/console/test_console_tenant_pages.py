"""A tenant's console pages: its adapters with status, failure reasons and residency, the upload, usage and
keys; never another tenant's data."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.console.session import SESSION_COOKIE
from scheduler.core.scheduler_stats import SchedulerStats
from tests.api.conftest import ADMIN, TenantHandle, adapter_paths, multipart_files
from tests.api.console.console_support import publish_worker, sign_in
from tests.api.test_completions_support import (
    BASE_MODEL,
    ScriptedWorkers,
    add_ready_version,
    sse_events,
    tokens_events,
    usage_rows,
)


def _console_upload(client: TestClient, csrf: str, name: str, paths: list[Path]):  # type: ignore[no-untyped-def]
    return client.post(
        "/console/adapters",
        data={"name": name, "base_model": BASE_MODEL, "visibility": "private"},
        files=multipart_files(paths),
        headers={"X-CSRF-Token": csrf},
    )


def test_upload_from_the_console_becomes_a_ready_version_on_the_adapter_page(
    client: TestClient, tenant: TenantHandle, demo_adapter: Path
) -> None:
    csrf = sign_in(client, tenant.key)
    response = _console_upload(client, csrf, "writer", adapter_paths(demo_adapter))
    assert response.status_code == 202, response.text
    assert response.json()["adapter"] == "writer"
    page = client.get("/console/adapters/writer")
    assert page.status_code == 200 and "writer@1" in page.text and "badge-ready" in page.text
    assert 'tier-disk">disk' in page.text  # ready, on no worker yet
    fragment = client.get("/console/adapters/writer", headers={"HX-Request": "true"})
    assert "<html" not in fragment.text and 'id="versions"' in fragment.text
    assert "hx-trigger" not in fragment.text  # nothing validating: no more polling
    listing = client.get("/console/adapters")
    assert "writer@1" in listing.text


def test_a_refused_upload_answers_the_same_error_as_the_api(
    client: TestClient, tenant: TenantHandle, demo_adapter: Path
) -> None:
    csrf = sign_in(client, tenant.key)
    response = _console_upload(client, csrf, "Bad Name", adapter_paths(demo_adapter))
    assert response.status_code == 400 and "invalid adapter name" in response.json()["error"]["message"]


def test_a_failed_version_shows_its_reason(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    version = add_ready_version(db_session, tenant.id, "broken")
    version.status, version.failure_reason = "failed", "lora_A of layer 0 has rank 512: the limit is 256"
    db_session.commit()
    sign_in(client, tenant.key)
    page = client.get("/console/adapters/broken")
    assert "badge-failed" in page.text and "has rank 512: the limit is 256" in page.text
    assert 'tier-none">none' in page.text


def test_residency_cold_starts_and_load_time_come_from_the_live_workers(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    version = add_ready_version(db_session, tenant.id, "hot")
    publish_worker(
        client,
        scheduler=SchedulerStats(
            device_adapters=(version.id,),
            adapter_num_loads={version.id: 3},
            adapter_load_seconds={version.id: 0.0125},
        ),
    )
    sign_in(client, tenant.key)
    page = client.get("/console/adapters/hot")
    assert 'tier-device">device' in page.text and "(1 workers)" in page.text
    assert "<td>3</td>" in page.text and "12.5 ms" in page.text


def test_another_tenants_adapters_are_neither_listed_nor_opened(
    client: TestClient, tenant: TenantHandle, new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    add_ready_version(db_session, tenant.id, "secret-sauce", visibility="private")
    other = new_tenant("other")
    sign_in(client, other.key)
    assert "secret-sauce" not in client.get("/console/adapters").text
    response = client.get("/console/adapters/secret-sauce")
    assert response.status_code == 404 and "you have no adapter named &#39;secret-sauce&#39;" in response.text
    assert response.headers["content-security-policy"]  # an error page is a console page
    fragment = client.get("/console/adapters/secret-sauce", headers={"HX-Request": "true"})
    assert fragment.status_code == 404 and "secret-sauce" in fragment.json()["error"]["message"]
    assert "secret-sauce" not in client.get("/console/playground").text


def test_usage_page_shows_own_tokens_cost_and_latency(
    client: TestClient, tenant: TenantHandle, new_tenant: Callable[[str], TenantHandle],
    workers: ScriptedWorkers, db_session: Session,
) -> None:  # fmt: skip
    workers.add("w1", events=tokens_events(3))
    body = {"model": BASE_MODEL, "prompt": "hi", "max_tokens": 3}
    assert client.post("/v1/completions", json=body, headers=tenant.headers).status_code == 200
    other = new_tenant("other")
    sign_in(client, other.key)
    assert "No requests in this period" in client.get("/console/usage").text
    sign_in(client, tenant.key)
    page = client.get("/console/usage")
    assert page.status_code == 200 and f"<td>{BASE_MODEL}</td><td>1</td>" in page.text
    assert page.text.count("data-chart=") == 4
    bad = client.get("/console/usage", params={"start": "yesterday"})
    assert bad.status_code == 200 and "is not a date" in bad.text


def test_keys_are_managed_by_the_tenant_only_when_the_operator_allows_it(
    client: TestClient, tenant: TenantHandle, new_tenant: Callable[[str], TenantHandle]
) -> None:
    other = new_tenant("other")
    csrf = sign_in(client, tenant.key)
    page = client.get("/console/keys")
    assert tenant.key_id in page.text and "Your operator manages your keys" in page.text
    assert client.post("/console/keys", data={"csrf_token": csrf}).status_code == 403
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"can_manage_keys": True}, headers=ADMIN)
    created = client.post("/console/keys", data={"csrf_token": csrf})
    assert created.status_code == 200 and 'id="new-key"' in created.text
    new_key = created.text.split('id="new-key">')[1].split("<")[0]
    assert client.get("/v1/adapters", headers={"Authorization": f"Bearer {new_key}"}).status_code == 200
    refused = client.post(f"/console/keys/{other.key_id}/revoke", data={"csrf_token": csrf})
    assert refused.status_code == 404
    assert client.get("/v1/adapters", headers=other.headers).status_code == 200
    revoked = client.post(f"/console/keys/{tenant.key_id}/revoke", data={"csrf_token": csrf})
    assert revoked.status_code == 200
    assert client.get("/v1/adapters", headers=tenant.headers).status_code == 401
    assert client.get("/console/keys", follow_redirects=False).status_code == 303  # its own session ended
    assert client.cookies.get(SESSION_COOKIE)  # the cookie is still there, but it opens nothing


def test_revoking_the_last_key_in_the_console_shows_why_it_is_refused(
    client: TestClient, tenant: TenantHandle
) -> None:
    """Issue 33 item 8: the console's keys page calls the /v1/keys handler, which refuses the last live key."""
    client.patch(f"/v1/admin/tenants/{tenant.id}", json={"can_manage_keys": True}, headers=ADMIN)
    csrf = sign_in(client, tenant.key)
    refused = client.post(
        f"/console/keys/{tenant.key_id}/revoke", data={"csrf_token": csrf}, headers={"Accept": "text/html"}
    )
    assert refused.status_code == 409 and "Create another key first" in refused.text
    assert client.get("/console/keys").status_code == 200  # still signed in
    assert client.get("/v1/adapters", headers=tenant.headers).status_code == 200


def test_playground_streams_a_chat_completion_billed_to_the_tenant(
    client: TestClient, tenant: TenantHandle, workers: ScriptedWorkers, db_session: Session
) -> None:
    workers.add("w1", events=tokens_events(3, finish_reason="stop"))
    csrf = sign_in(client, tenant.key)
    assert 'id="playground-form"' not in client.get("/console/playground").text  # no ready adapter yet
    body = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with client.stream(
        "POST", "/console/playground/chat", json=body, headers={"X-CSRF-Token": csrf}
    ) as response:
        assert response.status_code == 200
        events = sse_events(response.read().decode())
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1] if c["choices"])
    assert text == "t0 t1 t2 "
    [row] = usage_rows(db_session, tenant.id)
    assert row.status == "ok" and row.completion_tokens == 3


def test_an_adapter_is_deleted_from_its_page_by_its_owner_only(
    client: TestClient, tenant: TenantHandle, new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    add_ready_version(db_session, tenant.id, "old")
    other = new_tenant("other")
    other_csrf = sign_in(client, other.key)
    assert client.post("/console/adapters/old/delete", data={"csrf_token": other_csrf}).status_code == 404
    csrf = sign_in(client, tenant.key)
    assert 'id="delete-adapter"' in client.get("/console/adapters/old").text
    response = client.post("/console/adapters/old/delete", data={"csrf_token": csrf}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/console/adapters"
    assert "old@1" not in client.get("/console/adapters").text
    assert client.get("/v1/models/old", headers=tenant.headers).status_code == 404


def test_usage_csv_holds_the_tables_rows(
    client: TestClient, tenant: TenantHandle, workers: ScriptedWorkers
) -> None:
    workers.add("w1", events=tokens_events(3))
    body = {"model": BASE_MODEL, "prompt": "hi", "max_tokens": 3}
    assert client.post("/v1/completions", json=body, headers=tenant.headers).status_code == 200
    sign_in(client, tenant.key)
    assert 'id="usage-csv" href="/console/usage.csv?start=' in client.get("/console/usage").text
    response = client.get("/console/usage.csv")
    assert response.status_code == 200 and "attachment" in response.headers["content-disposition"]
    [row] = list(csv.DictReader(io.StringIO(response.text)))
    assert (row["model"], row["num_requests"], row["completion_tokens"]) == (BASE_MODEL, "1", "3")
    assert client.get("/console/usage.csv", params={"start": "soon"}).status_code == 400
