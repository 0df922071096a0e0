"""Blob stores for adapter files: a local directory and S3 (any S3-compatible endpoint).

Both stream: nothing reads a whole blob into memory. Keys are `/`-separated relative paths.
`make_blob_store(settings)` picks S3 for `s3://bucket/prefix` and a local directory otherwise.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from registry.errors import NotFoundError

if TYPE_CHECKING:
    from settings import Settings

COPY_CHUNK_BYTES = 1024 * 1024


class BlobNotFoundError(NotFoundError):
    """The key does not exist in the blob store."""

    code = "blob_not_found"


def check_key(key: str) -> str:
    """Reject empty, absolute or `..` keys (a key must stay inside the store)."""
    parts = key.split("/")
    if not key or any(p in ("..", ".", "") for p in parts) or "\\" in key:
        raise ValueError(f"invalid blob key {key!r}")
    return key


class BlobStore(ABC):
    """Where adapter files live. Implementations stream in and out and write atomically."""

    @abstractmethod
    def put_stream(self, key: str, fileobj: IO[bytes]) -> int:
        """Store the readable binary `fileobj` under `key` (streamed; replaces atomically). Returns bytes."""

    @abstractmethod
    def open(self, key: str) -> Any:
        """A context manager yielding a readable binary stream of the blob; BlobNotFoundError if missing."""

    @abstractmethod
    def download_to(self, key: str, path: Path) -> None:
        """Write the blob to a local file (atomically: temp file then rename)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """True when the key exists."""

    @abstractmethod
    def size(self, key: str) -> int:
        """The blob's size in bytes; BlobNotFoundError if missing."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the key (no error when it is already gone)."""

    @abstractmethod
    def copy(self, src: str, dst: str) -> None:
        """Copy a blob to a new key; BlobNotFoundError if `src` is missing."""

    @abstractmethod
    def list_keys(self, prefix: str = "") -> list[str]:
        """All keys that start with `prefix`, sorted."""

    @abstractmethod
    def list_keys_with_mtime(self, prefix: str = "") -> list[tuple[str, datetime]]:
        """(key, last-modified time, timezone-aware UTC) of every key that starts with `prefix`, sorted by key.

        The orphan sweeper (registry/upload_sweeper.py) leaves a blob younger than its minimum age alone: it may be
        being written right now, before the version row that will reference it commits.
        """

    @abstractmethod
    def delete_partial_writes(self, prefix: str, older_than: datetime) -> list[str]:
        """Discard writes under `prefix` that a killed process began before `older_than` and never finished
        (local: `.tmp-*.part` files; S3: incomplete multipart uploads). Returns what it removed."""

    def get_stream(self, key: str) -> Any:
        """Alias of `open` (a readable binary stream as a context manager)."""
        return self.open(key)

    def put_file(self, key: str, path: Path) -> int:
        """Store a local file under `key`."""
        with open(path, "rb") as fileobj:
            return self.put_stream(key, fileobj)

    def move(self, src: str, dst: str) -> None:
        """Copy then delete the source (S3 has no rename)."""
        self.copy(src, dst)
        self.delete(src)

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key under `prefix`."""
        for key in self.list_keys(prefix):
            self.delete(key)


class LocalBlobStore(BlobStore):
    """Blobs as files under a root directory; writes go to a temp file in the same dir, then rename."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put_stream(self, key: str, fileobj: IO[bytes]) -> int:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
        num_bytes = 0
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := fileobj.read(COPY_CHUNK_BYTES):
                    out.write(chunk)
                    num_bytes += len(chunk)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return num_bytes

    @contextmanager
    def open(self, key: str) -> Iterator[IO[bytes]]:
        path = self._path(key)
        if not path.is_file():
            raise BlobNotFoundError(f"blob {key!r} not found")
        with open(path, "rb") as fileobj:
            yield fileobj

    def download_to(self, key: str, path: Path) -> None:
        with self.open(key) as src:
            _atomic_write(Path(path), src)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {key!r} not found") from None

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        self._prune_empty_dirs(path.parent)

    def copy(self, src: str, dst: str) -> None:
        with self.open(src) as fileobj:
            self.put_stream(dst, fileobj)

    def move(self, src: str, dst: str) -> None:
        if not self.exists(src):
            raise BlobNotFoundError(f"blob {src!r} not found")
        dst_path = self._path(dst)
        dst_path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(src), dst_path)
        self._prune_empty_dirs(self._path(src).parent)

    def list_keys(self, prefix: str = "") -> list[str]:
        if not self.root.exists():
            return []
        keys = (
            p.relative_to(self.root).as_posix() for p in self._walk_files() if not p.name.startswith(".tmp-")
        )
        return sorted(k for k in keys if k.startswith(prefix))

    def list_keys_with_mtime(self, prefix: str = "") -> list[tuple[str, datetime]]:
        entries = []
        for key in self.list_keys(prefix):
            try:
                entries.append((key, _utc_from_timestamp(self._path(key).stat().st_mtime)))
            except FileNotFoundError:  # deleted or moved since it was listed
                continue
        return entries

    def delete_partial_writes(self, prefix: str, older_than: datetime) -> list[str]:
        if not self.root.exists():
            return []
        removed = []
        for path in list(self._walk_files()):
            name = path.relative_to(self.root).as_posix()
            is_partial = path.name.startswith(".tmp-") and path.name.endswith(".part")
            if is_partial and name.startswith(prefix) and _is_older(path, older_than):
                path.unlink(missing_ok=True)
                self._prune_empty_dirs(path.parent)
                removed.append(name)
        return sorted(removed)

    def _walk_files(self) -> Iterator[Path]:
        """Every file under the root. Tolerates folders removed while it walks (a concurrent delete or move
        prunes empty folders; os.walk skips what vanished, where Path.rglob raises)."""
        for folder, _, filenames in os.walk(self.root):
            for filename in filenames:
                path = Path(folder) / filename
                if path.is_file():
                    yield path

    def _prune_empty_dirs(self, directory: Path) -> None:
        root = self.root.resolve()
        directory = directory.resolve()
        while directory != root and root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent


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
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        keys = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
            keys.extend(item["Key"][strip:] for item in page.get("Contents", []))
        return sorted(keys)

    def list_keys_with_mtime(self, prefix: str = "") -> list[tuple[str, datetime]]:
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        entries = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
            entries.extend((item["Key"][strip:], item["LastModified"]) for item in page.get("Contents", []))
        return sorted(entries)

    def delete_partial_writes(self, prefix: str, older_than: datetime) -> list[str]:
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_multipart_uploads")
        removed = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
            for upload in page.get("Uploads", []):
                if upload["Initiated"] < older_than:
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    removed.append(upload["Key"][strip:])
        return sorted(removed)


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


def _utc_from_timestamp(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


def _is_older(path: Path, moment: datetime) -> bool:
    try:
        return _utc_from_timestamp(path.stat().st_mtime) < moment
    except FileNotFoundError:
        return False


def _atomic_write(path: Path, src: IO[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(src, out, COPY_CHUNK_BYTES)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        return S3BlobStore(bucket, prefix, endpoint_url=settings.storage.s3_endpoint_url, region=settings.storage.s3_region)
    return LocalBlobStore(Path(location))
