"""The console's import form (issue 39 item 3): an hf:// source with the tenant's own Hub token, posted as JSON
to the same endpoint as the drop zone, becomes a ready version whose page shows the commit it was read at; the
token never appears in a page."""

from __future__ import annotations

from pathlib import Path

from registry.validation import CONFIG_FILENAME, WEIGHTS_FILENAME
from tests.api.console.console_support import sign_in
from tests.api.test_completions_support import BASE_MODEL
from tests.registry.fake_hub import *  # the fake_hub fixture
from tests.registry.fake_hub import FakeHub

HUB_TOKEN = "hf_console_token_never_shown"


def test_console_import_form_reads_a_private_hub_repo_with_the_tenants_token(
    make_client, new_tenant, fake_hub: FakeHub, demo_adapter: Path
) -> None:
    files = {name: (demo_adapter / name).read_bytes() for name in (CONFIG_FILENAME, WEIGHTS_FILENAME)}
    commit = fake_hub.add_repo("org/private", files, token=HUB_TOKEN)
    client = make_client(import_hf_endpoint=fake_hub.url)
    tenant = new_tenant("console-importer")
    csrf = sign_in(client, tenant.key)
    form = client.get("/console/adapters").text
    assert 'id="import-form"' in form and 'name="hf_token" type="password"' in form
    body = {
        "name": "from-hub",
        "base_model": BASE_MODEL,
        "visibility": "private",
        "source": "hf://org/private",
    }
    refused = client.post("/console/adapters", json=body, headers={"X-CSRF-Token": csrf})
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "source_unreadable"
    accepted = client.post(
        "/console/adapters", json=body | {"hf_token": HUB_TOKEN}, headers={"X-CSRF-Token": csrf}
    )
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["version"]["source_revision"] == commit and HUB_TOKEN not in accepted.text
    page = client.get("/console/adapters/from-hub").text
    assert "from-hub@1" in page and f"commit {commit[:12]}" in page and HUB_TOKEN not in page


def test_console_import_needs_the_csrf_token(make_client, new_tenant, fake_hub: FakeHub) -> None:
    client = make_client(import_hf_endpoint=fake_hub.url)
    sign_in(client, new_tenant("console-importer").key)
    body = {"name": "from-hub", "source": "hf://org/lora"}
    assert client.post("/console/adapters", json=body).status_code == 403
    assert fake_hub.requests == []
