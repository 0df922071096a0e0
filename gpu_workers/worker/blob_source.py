"""`BlobSource`: the three blob store calls a worker makes (the host adapter cache and the base model fetch).

The worker never builds a blob store: its composition roots (the `lorahost` CLI commands, the tests) build one
from Settings with registry/blob_locations.py `make_blob_store` (a local directory or S3) and pass it to
builder.py `build_worker_service` / `make_runtime`, server.py `run_worker` or embedded.py `EmbeddedWorker`.
Any registry/storage.py `BlobStore` is a `BlobSource`; the engine side imports no blob store.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Protocol


class BlobSource(Protocol):
    """Read access to the blob store by key (`/`-separated relative paths)."""

    def exists(self, key: str) -> bool:
        """True when the key exists."""
        ...

    def open(self, key: str) -> AbstractContextManager[IO[bytes]]:
        """A context manager yielding a readable binary stream of the blob; an error if it is missing."""
        ...

    def download_to(self, key: str, path: Path) -> None:
        """Write the blob to a local file (atomically: temp file then rename)."""
        ...


def read_blob(blobs: BlobSource, key: str) -> bytes | None:
    """The whole blob at `key` (a small one: a manifest), or None when it does not exist."""
    if not blobs.exists(key):
        return None
    with blobs.open(key) as f:
        return bytes(f.read())
