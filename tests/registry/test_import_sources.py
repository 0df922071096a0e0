"""Adapter import sources: who may read which location with whose credentials, and one error for every
location that cannot be read (moto S3; issue 19 item 2)."""

from __future__ import annotations

import logging
import tarfile
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from registry import import_sources
from registry.errors import InvalidRequestError
from registry.import_sources import (
    UNREADABLE_MESSAGE,
    S3Credentials,
    SourceNotAllowedError,
    SourceUnreadableError,
)
from registry.validation import CONFIG_FILENAME, WEIGHTS_FILENAME, AdapterValidationError
from settings import Settings
from tests.registry.db_fixtures import free_port

TENANT_SECRET = "tenant-secret-never-shown"
ADAPTER_FILES = (CONFIG_FILENAME, WEIGHTS_FILENAME)


def _settings(tmp_path: Path, s3_endpoint: str, **overrides: object) -> Settings:
    values = {
        "data_dir": tmp_path,
        "s3_endpoint_url": s3_endpoint,
        "blob_store": "s3://platform-blobs/blobs",
        "is_import_private_network_allowed": True,  # moto listens on loopback
    }
    return Settings(**(values | overrides))


def _creds(**overrides: str) -> S3Credentials:
    return S3Credentials(**({"access_key_id": "tenant-key", "secret_access_key": TENANT_SECRET} | overrides))


def _read(settings: Settings, source: str, credentials: S3Credentials | None, dest: Path, max_bytes=10**9):
    parsed = import_sources.parse_import_source(source, settings)
    import_sources.check_import_allowed(parsed, credentials, settings)
    dest.mkdir(exist_ok=True)
    return import_sources.read_import_source(parsed, credentials, settings, dest, max_bytes).names


@pytest.fixture
def s3(s3_endpoint: str):
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


@pytest.fixture
def own_bucket(s3, s3_bucket: str, adapter_dirs: dict[str, Path], tmp_path: Path) -> str:
    """A tenant's bucket holding an adapter folder `lora/` and an archive `lora.tar.gz`."""
    adapter = next(iter(adapter_dirs.values()))
    for name in ADAPTER_FILES:
        s3.upload_file(str(adapter / name), s3_bucket, f"lora/{name}")
    archive = tmp_path / "lora.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ADAPTER_FILES:
            tar.add(adapter / name, arcname=f"lora/{name}")
    s3.upload_file(str(archive), s3_bucket, "lora.tar.gz")
    return s3_bucket


# ---- refused before anything is read -----------------------------------------------------------------


@pytest.mark.parametrize("how", ["no credentials", "tenant credentials", "allow-listed"])
@pytest.mark.parametrize("bucket", ["platform-blobs", "Platform-Blobs"])
def test_platform_blob_bucket_is_refused_whatever_the_credentials(tmp_path, s3_endpoint, how, bucket) -> None:
    allowed = "platform-blobs" if how == "allow-listed" else ""
    settings = _settings(tmp_path, s3_endpoint, import_allowed_buckets=allowed)
    credentials = _creds() if how == "tenant credentials" else None
    source = f"s3://{bucket}/blobs/adapters/other-tenant/other-adapter/1"
    with pytest.raises(SourceNotAllowedError, match="platform's own blob bucket"):
        _read(settings, source, credentials, tmp_path / "in")
    assert not (tmp_path / "in").exists()


def test_foreign_bucket_without_credentials_is_refused(tmp_path, s3_endpoint, own_bucket) -> None:
    with pytest.raises(SourceNotAllowedError, match="needs your own credentials") as err:
        _read(_settings(tmp_path, s3_endpoint), f"s3://{own_bucket}/lora", None, tmp_path / "in")
    assert err.value.code == "source_not_allowed"


def test_credentials_apply_to_s3_sources_only(tmp_path, s3_endpoint) -> None:
    with pytest.raises(InvalidRequestError, match="s3:// sources only"):
        _read(_settings(tmp_path, s3_endpoint), "https://example.com/a.zip", _creds(), tmp_path / "in")


@pytest.mark.parametrize(
    "source", ["/etc/passwd", "file:///etc/passwd", "ftp://example.com/a.zip", "https://example.com/folder/"]
)
def test_unsupported_sources_say_the_accepted_forms(tmp_path, s3_endpoint, source) -> None:
    with pytest.raises(InvalidRequestError, match="s3://bucket/folder") as err:
        import_sources.parse_import_source(source, _settings(tmp_path, s3_endpoint))
    assert err.value.code == "invalid_source"


def test_plain_http_and_http_endpoints_need_the_private_network_setting(tmp_path, s3_endpoint) -> None:
    settings = _settings(tmp_path, s3_endpoint, is_import_private_network_allowed=False)
    with pytest.raises(InvalidRequestError, match="not an accepted URL"):
        import_sources.parse_import_source("http://example.com/a.zip", settings)
    with pytest.raises(InvalidRequestError, match="endpoint_url"):
        _read(settings, "s3://bucket/lora", _creds(endpoint_url="http://example.com"), tmp_path / "in")


# ---- what may be read ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["lora", "lora.tar.gz"])
def test_tenant_credentials_read_the_tenant_bucket(tmp_path, s3_endpoint, own_bucket, key, caplog) -> None:
    with caplog.at_level(logging.DEBUG):
        names = _read(_settings(tmp_path, s3_endpoint), f"s3://{own_bucket}/{key}", _creds(), tmp_path / "in")
    assert sorted(names) == (sorted(ADAPTER_FILES) if key == "lora" else ["lora.tar.gz"])
    assert all((tmp_path / "in" / name).stat().st_size > 0 for name in names)
    assert TENANT_SECRET not in caplog.text


def test_allow_listed_bucket_is_read_with_platform_credentials(tmp_path, s3_endpoint, own_bucket) -> None:
    settings = _settings(tmp_path, s3_endpoint, import_allowed_buckets=f"other,{own_bucket}")
    assert sorted(_read(settings, f"s3://{own_bucket}/lora", None, tmp_path / "in")) == sorted(ADAPTER_FILES)


def test_presigned_https_url_is_read_without_credentials(tmp_path, s3_endpoint, s3, own_bucket) -> None:
    url = s3.generate_presigned_url("get_object", Params={"Bucket": own_bucket, "Key": "lora.tar.gz"})
    settings = _settings(tmp_path, s3_endpoint)
    assert _read(settings, url, None, tmp_path / "in") == ["lora.tar.gz"]
    redacted = import_sources.parse_import_source(url, settings).redacted
    assert "?" not in redacted and "Signature" not in redacted and redacted.endswith("/lora.tar.gz")


def test_readable_folder_with_wrong_files_keeps_its_validation_error(tmp_path, s3_endpoint, s3, s3_bucket):
    s3.put_object(Bucket=s3_bucket, Key="half/adapter_config.json", Body=b"{}")
    with pytest.raises(AdapterValidationError) as err:
        _read(_settings(tmp_path, s3_endpoint), f"s3://{s3_bucket}/half", _creds(), tmp_path / "in")
    assert err.value.code == "missing_weights"


def test_source_larger_than_the_limit_is_refused(tmp_path, s3_endpoint, own_bucket) -> None:
    with pytest.raises(AdapterValidationError) as err:
        _read(_settings(tmp_path, s3_endpoint), f"s3://{own_bucket}/lora", _creds(), tmp_path / "in", 1000)
    assert err.value.code == "upload_too_large" and "LORAHOST_MAX_UPLOAD_BYTES" in err.value.message


# ---- one error for every location that cannot be read ------------------------------------------------


def _stubbed_client_error(code: str, status: int) -> Callable[..., object]:
    def make(credentials: object, settings: object) -> object:
        client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
        stubber = Stubber(client)
        stubber.add_client_error("list_objects_v2", service_error_code=code, http_status_code=status)
        stubber.activate()
        return client

    return make


def _unreadable_cases(s3_endpoint: str, s3, bucket: str) -> dict[str, tuple[str, S3Credentials | None, dict]]:
    closed = f"http://127.0.0.1:{free_port()}"
    port = s3_endpoint.rsplit(":", 1)[1]
    missing_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "none.zip"})
    return {
        "missing bucket": ("s3://no-such-bucket-lorahost/lora", _creds(), {}),
        "missing archive key": (f"s3://{bucket}/none.tar.gz", _creds(), {}),
        "missing folder": (f"s3://{bucket}/none", _creds(), {}),
        "allow-listed missing bucket": ("s3://listed-but-missing/lora", None, {}),
        "unreachable endpoint": (f"s3://{bucket}/lora", _creds(endpoint_url=closed), {}),
        "presigned URL of a missing key": (missing_url, None, {}),
        "unreachable URL": (f"{closed}/lora.zip", None, {}),
        "loopback URL": (f"https://localhost:{port}/{bucket}/lora.tar.gz", None, {"private": False}),
        "metadata endpoint": ("https://169.254.169.254/latest/a.zip", None, {"private": False}),
        "NAT64 metadata URL": ("https://[64:ff9b::a9fe:a9fe]/latest/a.zip", None, {"private": False}),
        "NAT64 metadata endpoint": (
            f"s3://{bucket}/lora",
            _creds(endpoint_url="https://[64:ff9b::a9fe:a9fe]"),
            {"private": False},
        ),
        "site-local endpoint": (
            f"s3://{bucket}/lora",
            _creds(endpoint_url="https://[fec0::1]"),
            {"private": False},
        ),
        "access denied": (f"s3://{bucket}/lora", _creds(), {"stub": ("AccessDenied", 403)}),
        "wrong credentials": (f"s3://{bucket}/lora", _creds(), {"stub": ("InvalidAccessKeyId", 403)}),
        "operator bucket": (f"s3://{bucket}/lora", _creds(), {"stub": ("AllAccessDisabled", 403)}),
    }


def test_every_unreadable_location_gives_the_same_error(
    tmp_path, s3_endpoint, s3, own_bucket, monkeypatch, caplog
) -> None:
    messages = {}
    for case, (source, credentials, options) in _unreadable_cases(s3_endpoint, s3, own_bucket).items():
        settings = _settings(
            tmp_path,
            s3_endpoint,
            import_allowed_buckets="listed-but-missing",
            is_import_private_network_allowed=options.get("private", True),
        )
        with monkeypatch.context() as patch:
            if "stub" in options:
                patch.setattr(import_sources, "_s3_client", _stubbed_client_error(*options["stub"]))
            with pytest.raises(SourceUnreadableError) as err:
                _read(settings, source, credentials, tmp_path / case.replace(" ", "-"))
        messages[case] = (err.value.code, err.value.message)
    assert set(messages.values()) == {("source_unreadable", UNREADABLE_MESSAGE)}, messages
    for leak in ("NoSuch", "AccessDenied", "InvalidAccessKeyId", "404", own_bucket, TENANT_SECRET):
        assert leak not in UNREADABLE_MESSAGE
    assert TENANT_SECRET not in caplog.text and "X-Amz-Signature" not in caplog.text
