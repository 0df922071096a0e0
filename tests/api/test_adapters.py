"""POST/GET/DELETE /v1/adapters over HTTP with real demo adapters, on SQLite and PostgreSQL."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from registry import repository
from registry.models import Adapter, AdapterVersion
from registry.storage import LocalBlobStore
from tests.api.conftest import adapter_paths, upload


def _assert_nothing_stored(db_session: Session, blob_store: LocalBlobStore) -> None:
    db_session.expire_all()
    assert blob_store.list_keys() == []
    assert repository.count_rows(db_session, AdapterVersion) == 0
    assert repository.count_rows(db_session, Adapter) == 0


def _zip(adapter_dir: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w") as zf:
        for path in adapter_paths(adapter_dir):
            zf.write(path, arcname=path.name)
    return dest


def _tar_gz(adapter_dir: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        for path in adapter_paths(adapter_dir):
            tar.add(path, arcname=f"my-adapter/{path.name}")
    return dest


def test_uploaded_folder_files_become_ready_in_the_202_response(
    client, tenant, demo_adapter, blob_store
) -> None:
    response = upload(client, tenant, "my-lora", adapter_paths(demo_adapter))
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["adapter"] == "my-lora" and body["visibility"] == "private"
    assert body["version"]["status"] == "ready" and body["version"]["model"] == "my-lora@1"
    assert body["version"]["rank"] > 0 and body["version"]["sha256"]
    assert all(k.startswith(f"adapters/{tenant.id}/") for k in blob_store.list_keys())
    assert len(blob_store.list_keys()) == 2


def test_a_dora_version_says_so(client, tenant, demo_adapter, base_model_dir, tmp_path) -> None:
    from gpu_workers.engine.demo_model import generate_adapter

    dora = generate_adapter(base_model_dir, tmp_path / "dora", 4, ("q_proj", "v_proj"), seed=3, use_dora=True)
    shown = upload(client, tenant, "my-dora", adapter_paths(dora)).json()["version"]
    assert shown["status"] == "ready" and shown["use_dora"] is True
    assert (
        upload(client, tenant, "my-lora", adapter_paths(demo_adapter)).json()["version"]["use_dora"] is False
    )
    listed = client.get("/v1/adapters/my-dora/versions", headers=tenant.headers).json()["data"]
    assert [v["use_dora"] for v in listed] == [True]


def test_upload_with_peft_readme_is_accepted(client, tenant, demo_adapter) -> None:
    paths = [*adapter_paths(demo_adapter), demo_adapter / "README.md"]
    assert upload(client, tenant, "with-readme", paths).json()["version"]["status"] == "ready"


@pytest.mark.parametrize("make_archive", [_zip, _tar_gz], ids=["zip", "tar.gz"])
def test_uploaded_archive_becomes_ready(client, tenant, demo_adapter, tmp_path, make_archive) -> None:
    suffix = ".zip" if make_archive is _zip else ".tar.gz"
    archive = make_archive(demo_adapter, tmp_path / f"adapter{suffix}")
    response = upload(client, tenant, "archived", [archive])
    assert response.status_code == 202, response.text
    assert response.json()["version"]["status"] == "ready"


def test_reupload_creates_version_n_plus_1_and_name_at_n_addresses_it(client, tenant, adapter_dirs) -> None:
    first, second = list(adapter_dirs.values())[:2]
    assert upload(client, tenant, "my-lora", adapter_paths(first)).json()["version"]["number"] == 1
    assert upload(client, tenant, "my-lora", adapter_paths(second)).json()["version"]["number"] == 2
    adapter = client.get("/v1/adapters/my-lora", headers=tenant.headers).json()
    assert [v["number"] for v in adapter["versions"]] == [1, 2] and adapter["latest_ready_version"] == 2
    pinned = client.get("/v1/adapters/my-lora@1", headers=tenant.headers).json()
    assert [v["model"] for v in pinned["versions"]] == ["my-lora@1"]
    assert client.get("/v1/models/my-lora@1", headers=tenant.headers).json()["version"] == 1
    assert client.get("/v1/adapters/my-lora@3", headers=tenant.headers).status_code == 404


@pytest.mark.parametrize("pin", ["\u0661", "\u00b2", "\uff11", "99999999999999999999", "2147483648"])
def test_version_pin_outside_ascii_digits_or_the_column_range_is_400(
    client, tenant, demo_adapter, pin
) -> None:
    # on main "@\u0661" (Arabic-Indic one) served version 1, and "@\u00b2" or a 20-digit pin were 500s
    assert upload(client, tenant, "good-b", adapter_paths(demo_adapter)).status_code == 202
    model = f"good-b@{pin}"
    for response in (
        client.get(f"/v1/adapters/{model}", headers=tenant.headers),
        client.get(f"/v1/models/{model}", headers=tenant.headers),
        client.post("/v1/completions", json={"model": model, "prompt": "hi"}, headers=tenant.headers),
    ):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_name"
        assert "ASCII digits" in response.json()["error"]["message"]


@pytest.mark.parametrize("name", ["Has Caps", "-x", "a/b", "x" * 65, "lorahost-base"])
def test_invalid_adapter_name_is_400_and_stores_nothing(
    client, tenant, demo_adapter, db_session, blob_store, name
):
    response = upload(client, tenant, name, adapter_paths(demo_adapter))
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_name"
    _assert_nothing_stored(db_session, blob_store)


def test_invalid_visibility_is_400(client, tenant, demo_adapter, db_session, blob_store) -> None:
    response = upload(client, tenant, "x", adapter_paths(demo_adapter), visibility="everyone")
    assert response.status_code == 400 and "visibility" in response.json()["error"]["message"]
    _assert_nothing_stored(db_session, blob_store)


def test_upload_over_max_upload_bytes_is_413_with_a_clear_message(
    make_client, new_tenant, demo_adapter, db_session, blob_store
):
    client = make_client(max_upload_bytes=4096)
    tenant = new_tenant("small")
    response = upload(client, tenant, "big", adapter_paths(demo_adapter))
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "upload_too_large"
    assert "4096 bytes" in response.json()["error"]["message"]
    _assert_nothing_stored(db_session, blob_store)


def test_chunked_upload_over_the_limit_is_413(make_client, new_tenant, demo_adapter) -> None:
    client = make_client(max_upload_bytes=4096)
    tenant = new_tenant("chunked")
    body = (
        b"--b\r\n"
        + b'Content-Disposition: form-data; name="files"; filename="adapter_model.safetensors"\r\n\r\n'
    )
    body += b"\0" * 10000 + b"\r\n--b--\r\n"

    def chunks():
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    headers = {**tenant.headers, "content-type": "multipart/form-data; boundary=b"}
    response = client.post("/v1/adapters", content=chunks(), headers=headers)
    assert response.status_code == 413


def test_upload_without_files_or_name_is_400(client, tenant) -> None:
    no_files = client.post(
        "/v1/adapters", data={"name": "x"}, files=[("other", ("a", b"x"))], headers=tenant.headers
    )
    assert no_files.status_code == 400 and "files=@adapter_config.json" in no_files.json()["error"]["message"]
    no_name = client.post(
        "/v1/adapters", files=[("files", ("adapter_config.json", b"{}"))], headers=tenant.headers
    )
    assert no_name.status_code == 400 and "'name'" in no_name.json()["error"]["message"]


def test_upload_with_unsupported_content_type_is_415(client, tenant) -> None:
    response = client.post(
        "/v1/adapters", content=b"x", headers={**tenant.headers, "content-type": "text/plain"}
    )
    assert response.status_code == 415


def test_json_import_with_non_s3_source_is_400(client, tenant, db_session, blob_store) -> None:
    response = client.post(
        "/v1/adapters", json={"name": "x", "source": "/etc/passwd"}, headers=tenant.headers
    )
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_source"
    _assert_nothing_stored(db_session, blob_store)


def test_json_import_with_missing_fields_is_422(client, tenant) -> None:
    response = client.post("/v1/adapters", json={"name": "x"}, headers=tenant.headers)
    assert response.status_code == 422 and "source" in response.json()["error"]["message"]


TENANT_SECRET = "tenant-secret-never-echoed"
TENANT_CREDENTIALS = {"access_key_id": "tenant-key", "secret_access_key": TENANT_SECRET}


def _put_adapter(s3_endpoint: str, bucket: str, prefix: str, adapter_dir: Path) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    for path in adapter_paths(adapter_dir):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")


def test_json_import_from_s3_with_own_credentials_runs_the_job(
    make_client, new_tenant, s3_endpoint, s3_bucket, demo_adapter
) -> None:
    _put_adapter(s3_endpoint, s3_bucket, "lora", demo_adapter)
    client = make_client(s3_endpoint_url=s3_endpoint)
    tenant = new_tenant("importer")
    body = {"name": "imported", "source": f"s3://{s3_bucket}/lora", "credentials": TENANT_CREDENTIALS}
    response = client.post("/v1/adapters", json=body, headers=tenant.headers)
    assert response.status_code == 202 and response.json()["version"]["status"] == "ready", response.text
    assert TENANT_SECRET not in response.text


def test_json_import_from_an_allow_listed_bucket_needs_no_credentials(
    make_client, new_tenant, s3_endpoint, s3_bucket, demo_adapter
) -> None:
    _put_adapter(s3_endpoint, s3_bucket, "lora", demo_adapter)
    client = make_client(s3_endpoint_url=s3_endpoint, import_allowed_buckets=s3_bucket)
    body = {"name": "imported", "source": f"s3://{s3_bucket}/lora"}
    response = client.post("/v1/adapters", json=body, headers=new_tenant("importer").headers)
    assert response.status_code == 202 and response.json()["version"]["status"] == "ready", response.text


def test_json_import_from_a_foreign_bucket_without_credentials_is_403(
    make_client, new_tenant, s3_endpoint, s3_bucket, demo_adapter, db_session, blob_store
) -> None:
    _put_adapter(s3_endpoint, s3_bucket, "lora", demo_adapter)
    client = make_client(s3_endpoint_url=s3_endpoint)
    body = {"name": "imported", "source": f"s3://{s3_bucket}/lora"}
    response = client.post("/v1/adapters", json=body, headers=new_tenant("importer").headers)
    assert response.status_code == 403 and response.json()["error"]["type"] == "source_not_allowed"
    assert "credentials" in response.json()["error"]["message"]
    _assert_nothing_stored(db_session, blob_store)


@pytest.mark.parametrize("credentials", [None, TENANT_CREDENTIALS], ids=["platform", "tenant"])
def test_import_of_another_tenants_adapter_from_the_platform_bucket_is_refused(
    make_client, new_tenant, s3_endpoint, s3_bucket, demo_adapter, credentials, db_session
) -> None:
    client = make_client(
        s3_endpoint_url=s3_endpoint, blob_store=f"s3://{s3_bucket}/blobs", import_allowed_buckets=s3_bucket
    )
    alice, mallory = new_tenant("alice"), new_tenant("mallory")
    _put_adapter(s3_endpoint, s3_bucket, f"blobs/adapters/{alice.id}/private-adapter/1", demo_adapter)
    body = {"name": "stolen", "source": f"s3://{s3_bucket}/blobs/adapters/{alice.id}/private-adapter/1"}
    if credentials:
        body["credentials"] = credentials
    response = client.post("/v1/adapters", json=body, headers=mallory.headers)
    assert response.status_code == 403, response.text
    assert "platform's own blob bucket" in response.json()["error"]["message"]
    db_session.expire_all()
    assert repository.count_rows(db_session, AdapterVersion) == 0


def test_every_unreadable_import_source_gets_the_same_error_and_stores_nothing(
    make_client, new_tenant, s3_endpoint, s3_bucket, demo_adapter, db_session, blob_store
) -> None:
    _put_adapter(s3_endpoint, s3_bucket, "lora", demo_adapter)
    client = make_client(s3_endpoint_url=s3_endpoint, import_allowed_buckets="listed-but-missing")
    tenant = new_tenant("prober")
    sources = [
        (f"s3://no-such-bucket-{s3_bucket}/lora", TENANT_CREDENTIALS),  # missing bucket
        (f"s3://{s3_bucket}/missing-folder", TENANT_CREDENTIALS),  # missing key (folder)
        (f"s3://{s3_bucket}/missing.tar.gz", TENANT_CREDENTIALS),  # missing key (archive)
        ("s3://listed-but-missing/lora", None),  # allow-listed, read with the platform's credentials
        ("https://169.254.169.254/latest/meta-data/x.zip", None),  # metadata endpoint: never connected to
    ]
    responses = []
    for source, credentials in sources:
        body = {"name": "probe", "source": source} | ({"credentials": credentials} if credentials else {})
        responses.append(client.post("/v1/adapters", json=body, headers=tenant.headers))
    assert {(r.status_code, r.text) for r in responses} == {(responses[0].status_code, responses[0].text)}
    assert responses[0].status_code == 400
    assert responses[0].json()["error"]["type"] == "source_unreadable"
    for leak in ("NoSuch", "NotFound", "AccessDenied", "internal", s3_bucket, TENANT_SECRET):
        assert leak not in responses[0].text
    _assert_nothing_stored(db_session, blob_store)


NAT64_METADATA = "64:ff9b::a9fe:a9fe"  # a NAT64 gateway turns it into 169.254.169.254


def test_imports_and_s3_endpoints_inside_ipv6_get_the_generic_error_and_connect_nowhere(
    make_client, new_tenant, monkeypatch, db_session, blob_store
) -> None:
    """Issue 33 item 3: an IPv4 address inside IPv6 is checked as that IPv4 address, whichever way in."""
    import boto3
    import httpx

    from registry import public_addresses

    names = {"nat64.example": [NAT64_METADATA], "site-local.example": ["fec0::1"]}
    monkeypatch.setattr(public_addresses, "system_resolve", lambda host, port: names.get(host, [host]))
    connections: list[object] = []
    monkeypatch.setattr(httpx.Client, "send", lambda *args, **kwargs: connections.append(args))
    monkeypatch.setattr(boto3.session.Session, "client", lambda *args, **kwargs: connections.append(args))
    client = make_client()
    tenant = new_tenant("prober")
    urls = [f"https://[{NAT64_METADATA}]", "https://[::ffff:0:a9fe:a9fe]", "https://[::a9fe:a9fe]",
            "https://[64:ff9b:1::a9fe:a9fe]", "https://[2002:a9fe:a9fe::1]", "https://[fec0::1]",
            "https://nat64.example", "https://site-local.example"]  # fmt: skip
    bodies = [{"name": "probe", "source": f"{url}/lora.zip"} for url in urls] + [
        {
            "name": "probe",
            "source": "s3://tenant-bucket/lora",
            "credentials": TENANT_CREDENTIALS | {"endpoint_url": url},
        }
        for url in urls
    ]
    responses = [client.post("/v1/adapters", json=body, headers=tenant.headers) for body in bodies]
    assert {(r.status_code, r.json()["error"]["type"]) for r in responses} == {(400, "source_unreadable")}
    assert len({r.text for r in responses}) == 1
    assert connections == []
    _assert_nothing_stored(db_session, blob_store)


def test_public_adapter_shows_its_owner_name_and_not_its_tenant_id_to_others(
    client, new_tenant, demo_adapter
) -> None:
    alice, bob = new_tenant("alice"), new_tenant("bob")
    upload(client, alice, "shared", adapter_paths(demo_adapter), visibility="public")
    views = [
        client.get("/v1/adapters/shared", headers=bob.headers).json(),
        client.get("/v1/adapters/shared@1", headers=bob.headers).json(),
        *client.get("/v1/adapters?include_public=true", headers=bob.headers).json()["data"],
    ]
    for view in views:
        assert view["owner"] == "alice" and view["owner_tenant_id"] is None
        assert alice.id not in str(view)
    own = client.get("/v1/adapters/shared", headers=alice.headers).json()
    assert own["owner"] == "alice" and own["owner_tenant_id"] == alice.id


def test_lists_own_adapters_and_optionally_public_ones(client, new_tenant, demo_adapter) -> None:
    alice, bob = new_tenant("alice"), new_tenant("bob")
    upload(client, alice, "alice-public", adapter_paths(demo_adapter), visibility="public")
    upload(client, bob, "bob-private", adapter_paths(demo_adapter))
    names = lambda r: [a["name"] for a in r.json()["data"]]
    assert names(client.get("/v1/adapters", headers=bob.headers)) == ["bob-private"]
    assert names(client.get("/v1/adapters?include_public=true", headers=bob.headers)) == [
        "alice-public",
        "bob-private",
    ]


def test_delete_soft_deletes_and_hides_the_adapter(client, tenant, demo_adapter, db_session) -> None:
    upload(client, tenant, "gone", adapter_paths(demo_adapter))
    response = client.delete("/v1/adapters/gone", headers=tenant.headers)
    assert response.status_code == 200 and response.json()["deleted"] is True
    assert client.get("/v1/adapters/gone", headers=tenant.headers).status_code == 404
    assert "gone" not in [m["id"] for m in client.get("/v1/models", headers=tenant.headers).json()["data"]]
    db_session.expire_all()
    assert repository.count_rows(db_session, Adapter) == 1  # soft: the row stays, marked deleted
    again = upload(client, tenant, "gone", adapter_paths(demo_adapter))
    assert again.json()["version"]["number"] == 1


def test_delete_with_version_suffix_is_400(client, tenant) -> None:
    assert client.delete("/v1/adapters/x@1", headers=tenant.headers).status_code == 400


def test_uploads_of_two_tenants_may_share_a_name(client, new_tenant, demo_adapter) -> None:
    alice, bob = new_tenant("alice"), new_tenant("bob")
    assert upload(client, alice, "same", adapter_paths(demo_adapter)).json()["version"]["number"] == 1
    assert upload(client, bob, "same", adapter_paths(demo_adapter)).json()["version"]["number"] == 1
