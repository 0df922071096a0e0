"""Every malformed upload from tests/registry/malformed.py is refused over HTTP with the validator's code
and message, and leaves nothing stored (no blob, no row)."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session

from registry import repository
from registry.base_model_choice import SHAPE_MISMATCH_CODES
from registry.models import Adapter, AdapterVersion
from registry.storage import LocalBlobStore
from registry.validation import AdapterValidationError, BaseModelSpec, ValidationLimits
from tests.api.conftest import TenantHandle, adapter_paths, multipart_files, upload
from tests.registry.malformed import (
    MALFORMED_CASES,
    TIGHT_LIMIT_CASES,
    TIGHT_LIMITS,
    VALID_CASES,
    validate_upload_files,
)
from tests.registry.upload_builders import MalformedCase

TIGHT_SETTINGS = {
    "max_rank": TIGHT_LIMITS.max_rank,
    "max_adapter_bytes": TIGHT_LIMITS.max_adapter_bytes,
    "max_uncompressed_bytes": TIGHT_LIMITS.max_uncompressed_bytes,
    "max_archive_members": TIGHT_LIMITS.max_archive_members,
}


def _expected_error(
    files: list[Path], work_dir: Path, spec: BaseModelSpec, limits: ValidationLimits
) -> AdapterValidationError:
    with pytest.raises(AdapterValidationError) as err:
        validate_upload_files(files, work_dir, spec, limits)
    return err.value


def _assert_refused(
    response, expected: AdapterValidationError, db_session: Session, blob_store: LocalBlobStore
) -> None:  # type: ignore[no-untyped-def]
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["type"] == expected.code
    assert error["message"] == expected.message or (  # a shape mismatch also lists the available bases
        expected.code in SHAPE_MISMATCH_CODES and error["message"].startswith(expected.message)
    )
    if expected.code.endswith("too_large") and expected.code != "rank_too_large":
        assert response.status_code == 413
    db_session.expire_all()
    assert blob_store.list_keys() == []
    assert repository.count_rows(db_session, AdapterVersion) == 0
    assert repository.count_rows(db_session, Adapter) == 0


@pytest.mark.slow  # every malformed case over HTTP; tests/registry/test_validation.py has them without HTTP
@pytest.mark.parametrize("case", MALFORMED_CASES, ids=[c.case_id for c in MALFORMED_CASES])
def test_malformed_upload_is_refused_and_nothing_is_stored(
    case: MalformedCase,
    client,
    tenant: TenantHandle,
    base_model_dir: Path,
    tmp_path: Path,
    db_session,
    blob_store,
) -> None:
    files = case.build(tmp_path)
    expected = _expected_error(
        files, tmp_path / "ref", BaseModelSpec.from_model_dir(base_model_dir), ValidationLimits()
    )
    assert expected.code == case.expected_code
    _assert_refused(upload(client, tenant, "bad", files), expected, db_session, blob_store)


@pytest.mark.parametrize("case", TIGHT_LIMIT_CASES, ids=[c.case_id for c in TIGHT_LIMIT_CASES])
def test_upload_over_configured_limits_is_refused(
    case: MalformedCase, make_client, new_tenant, base_model_dir: Path, tmp_path: Path, db_session, blob_store
) -> None:
    client = make_client(**TIGHT_SETTINGS)
    tenant = new_tenant("tight")
    files = case.build(tmp_path)
    expected = _expected_error(
        files, tmp_path / "ref", BaseModelSpec.from_model_dir(base_model_dir), TIGHT_LIMITS
    )
    assert expected.code == case.expected_code
    _assert_refused(upload(client, tenant, "bad", files), expected, db_session, blob_store)


@pytest.mark.parametrize("case", VALID_CASES, ids=[c.case_id for c in VALID_CASES])
def test_valid_upload_variants_become_ready(
    case: MalformedCase, make_client, new_tenant, tmp_path: Path
) -> None:
    client = make_client(**TIGHT_SETTINGS)
    tenant = new_tenant("valid")
    response = upload(client, tenant, "good", case.build(tmp_path))
    assert response.status_code == 202, response.text
    assert response.json()["version"]["status"] == "ready"


# ---- a client that disconnects in the middle of the body ---------------------------------------------


def _multipart_request(tenant: TenantHandle, paths: list[Path]) -> httpx.Request:
    request = httpx.Request(
        "POST",
        "http://testserver/v1/adapters",
        data={"name": "abandoned"},
        files=multipart_files(paths),
        headers=tenant.headers,
    )
    request.read()
    return request


def _asgi_scope(request: httpx.Request) -> dict[str, object]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 50000),
        "path": "/v1/adapters",
        "raw_path": b"/v1/adapters",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.items()],
    }


async def _call_disconnecting_after(app, request: httpx.Request, num_bytes: int) -> list[dict]:  # type: ignore[no-untyped-def]
    """Send the first `num_bytes` of the body, then http.disconnect (what a dropped client looks like)."""
    messages = iter(
        [
            {"type": "http.request", "body": request.content[:num_bytes], "more_body": True},
            {"type": "http.disconnect"},
        ]
    )
    sent: list[dict] = []

    async def receive() -> dict:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: dict) -> None:
        sent.append(message)

    await app(_asgi_scope(request), receive, send)
    return sent


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.99])
def test_client_disconnect_mid_upload_is_logged_once_and_stores_nothing(
    fraction: float,
    client,
    tenant: TenantHandle,
    demo_adapter: Path,
    db_session: Session,
    blob_store: LocalBlobStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    upload_tmp = tmp_path / "upload-tmp"
    upload_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(upload_tmp))
    request = _multipart_request(tenant, adapter_paths(demo_adapter))
    with caplog.at_level(logging.INFO):
        asyncio.run(_call_disconnecting_after(client.app, request, int(len(request.content) * fraction)))
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert len([r for r in caplog.records if "disconnected" in r.getMessage()]) == 1
    db_session.expire_all()
    assert blob_store.list_keys() == []
    assert repository.count_rows(db_session, AdapterVersion) == 0
    assert repository.count_rows(db_session, Adapter) == 0
    # upload-tmp/<api instance>/ may remain; no upload's scratch folder or file inside it does
    assert [p for p in upload_tmp.rglob("*") if p.parent != upload_tmp] == []


def test_client_disconnect_mid_import_request_is_logged_once_and_stores_nothing(
    client, tenant: TenantHandle, db_session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    request = httpx.Request(
        "POST",
        "http://testserver/v1/adapters",
        json={"name": "abandoned", "source": "s3://bucket/lora"},
        headers=tenant.headers,
    )
    request.read()
    with caplog.at_level(logging.INFO):
        asyncio.run(_call_disconnecting_after(client.app, request, 10))
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert len([r for r in caplog.records if "disconnected" in r.getMessage()]) == 1
    db_session.expire_all()
    assert repository.count_rows(db_session, AdapterVersion) == 0
