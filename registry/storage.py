"""Blob stores for adapter files: the `BlobStore` interface and `LocalBlobStore` (a local directory).

Every store streams: nothing reads a whole blob into memory. Keys are `/`-separated relative paths.
`S3BlobStore` (any S3-compatible endpoint) is in registry/s3_storage.py; `make_blob_store(settings)`
(registry/blob_locations.py) picks S3 for `s3://bucket/prefix` and a local directory otherwise.
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
from typing import IO, Any

from registry.errors import NotFoundError

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
