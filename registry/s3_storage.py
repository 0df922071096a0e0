"""`S3BlobStore`: blobs in an S3 bucket (any S3-compatible endpoint) under a key prefix, streamed through
boto3's multipart transfers; an object becomes visible only when its upload completes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from registry.storage import BlobNotFoundError, BlobStore, check_key


class S3BlobStore(BlobStore):
    """Blobs in an S3 bucket under a key prefix; streaming multipart upload/download via boto3."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        multipart_chunk_bytes: int = 8 * 1024 * 1024,
        client: Any = None,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
        self.transfer_config = TransferConfig(
            multipart_threshold=multipart_chunk_bytes, multipart_chunksize=multipart_chunk_bytes
        )

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_stream(self, key: str, fileobj: IO[bytes]) -> int:
        counter = _CountingReader(fileobj)
        # upload_fileobj streams in parts; S3 only makes the object visible when the upload completes.
        self.client.upload_fileobj(counter, self.bucket, self._key(key), Config=self.transfer_config)
        return counter.num_bytes

    @contextmanager
    def open(self, key: str) -> Iterator[IO[bytes]]:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except self.client.exceptions.NoSuchKey:
            raise BlobNotFoundError(f"blob {key!r} not found") from None
        body = response["Body"]
        try:
            yield body
        finally:
            body.close()

    def download_to(self, key: str, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out:
                self.client.download_fileobj(self.bucket, self._key(key), out, Config=self.transfer_config)
            os.replace(tmp, path)
        except Exception as exc:
            Path(tmp).unlink(missing_ok=True)
            if _is_missing(exc):
                raise BlobNotFoundError(f"blob {key!r} not found") from None
            raise

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except BlobNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if _is_missing(exc):
                raise BlobNotFoundError(f"blob {key!r} not found") from None
            raise
        return int(head["ContentLength"])

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def copy(self, src: str, dst: str) -> None:
        source = {"Bucket": self.bucket, "Key": self._key(src)}
        try:
            self.client.copy(source, self.bucket, self._key(dst), Config=self.transfer_config)
        except Exception as exc:
            if _is_missing(exc):
                raise BlobNotFoundError(f"blob {src!r} not found") from None
            raise

    def list_keys(self, prefix: str = "") -> list[str]:
        return [key for key, _ in self.list_keys_with_mtime(prefix)]

    def list_keys_with_mtime(self, prefix: str = "") -> list[tuple[str, datetime]]:
        paginator = self.client.get_paginator("list_objects_v2")
        entries = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._full_prefix(prefix)):
            for item in page.get("Contents", []):
                entries.append((self._relative(item["Key"]), item["LastModified"]))
        return sorted(entries)

    def delete_partial_writes(self, prefix: str, older_than: datetime) -> list[str]:
        paginator = self.client.get_paginator("list_multipart_uploads")
        removed = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._full_prefix(prefix)):
            for upload in page.get("Uploads", []):
                if upload["Initiated"] < older_than:
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    removed.append(self._relative(upload["Key"]))
        return sorted(removed)

    def _full_prefix(self, prefix: str) -> str:
        """A key prefix of this store as a bucket key prefix (not checked: a prefix may end mid-name)."""
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def _relative(self, bucket_key: str) -> str:
        """A bucket key under this store's prefix as a key of this store."""
        return bucket_key[len(self.prefix) + 1 :] if self.prefix else bucket_key


class _CountingReader:
    """Wraps a binary stream: counts bytes and fills each read (boto3 treats a short read as the end of a
    small object, so a stream with short reads would otherwise never be sent as a multipart upload)."""

    def __init__(self, fileobj: IO[bytes]) -> None:
        self.fileobj = fileobj
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            data = self.fileobj.read()
        else:
            parts, remaining = [], size
            while remaining > 0 and (chunk := self.fileobj.read(remaining)):
                parts.append(chunk)
                remaining -= len(chunk)
            data = b"".join(parts)
        self.num_bytes += len(data)
        return data


def _is_missing(exc: Exception) -> bool:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound"}
