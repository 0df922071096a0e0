"""Which blob store a location names: `s3://bucket/prefix` is S3 (registry/s3_storage.py), anything else a
local directory (registry/storage.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from registry.s3_storage import S3BlobStore
from registry.storage import BlobStore, LocalBlobStore

if TYPE_CHECKING:
    from settings import Settings


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split `s3://bucket/prefix` into (bucket, prefix)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI {uri!r} has no bucket")
    return bucket, prefix.strip("/")


def make_blob_store(settings: Settings, location: str | None = None) -> BlobStore:
    """The blob store for `location` (default: the configured one): S3 for s3://, else a local directory."""
    location = location or settings.resolved_blob_store()
    if location.startswith("s3://"):
        bucket, prefix = parse_s3_uri(location)
        return S3BlobStore(
            bucket, prefix, endpoint_url=settings.storage.s3_endpoint_url, region=settings.storage.s3_region
        )
    return LocalBlobStore(Path(location))
