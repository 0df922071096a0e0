"""S3 unavailable (a fault proxy in front of the moto server resets every connection and refuses new ones):
an upload answers 503 storage_unavailable with Retry-After and leaves no version row and no blob behind; once
S3 answers again the same upload succeeds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

import boto3
import pytest
from botocore.config import Config
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from benchmarks.fault_proxy import FaultProxy
from registry.models import AdapterVersion
from registry.s3_storage import S3BlobStore
from tests.api.conftest import TenantHandle, adapter_paths, upload

pytestmark = pytest.mark.slow  # a moto server behind a fault proxy


@pytest.fixture
def s3_proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    address = urlparse(s3_endpoint)
    proxy = FaultProxy(address.hostname or "127.0.0.1", address.port or 80)
    yield proxy
    proxy.close()


@pytest.fixture
def blob_store(s3_proxy: FaultProxy, s3_bucket: str) -> S3BlobStore:  # the API's store, through the proxy
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{s3_proxy.port}",
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=2, read_timeout=5),
    )
    return S3BlobStore(s3_bucket, client=client)


def _num_objects(s3_endpoint: str, bucket: str) -> int:
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    return int(client.list_objects_v2(Bucket=bucket).get("KeyCount", 0))


def test_an_upload_while_s3_is_unavailable_answers_503_and_keeps_nothing(
    make_client: Callable[..., TestClient],
    new_tenant: Callable[[str], TenantHandle],
    s3_proxy: FaultProxy,
    s3_endpoint: str,
    s3_bucket: str,
    db_session: Session,
    demo_adapter: Path,
) -> None:
    client = make_client()
    tenant = new_tenant("s3-outage")
    s3_proxy.cut()
    response = upload(client, tenant, "during", adapter_paths(demo_adapter))
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "storage_unavailable"
    assert response.headers["Retry-After"] == "5"
    assert db_session.scalar(select(func.count()).select_from(AdapterVersion)) == 0
    s3_proxy.restore()
    assert _num_objects(s3_endpoint, s3_bucket) == 0  # nothing half-written
    response = upload(client, tenant, "during", adapter_paths(demo_adapter))
    assert response.status_code in (201, 202), response.text
