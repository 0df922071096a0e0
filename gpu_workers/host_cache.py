"""Host-memory/disk cache of adapter files, keyed by the sha256 of adapter_model.safetensors.

A worker fetches an adapter version from the blob store once: concurrent requests for the same sha256 wait
for the one download in progress. Files are downloaded into a temporary directory, the weights' sha256 is
verified, and only then is the directory renamed into place — a reader never sees a partial adapter.
The fetch function is injected (the worker server passes the blob store's download), so this module does
no I/O of its own beyond the local cache directory.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"

FetchFn = Callable[[str, Path], None]  # (blob key, destination file path) -> None


class ChecksumMismatchError(RuntimeError):
    """The downloaded weights do not hash to the expected sha256 (corrupt or tampered blob)."""


@dataclass(frozen=True)
class HostCacheStats:
    """Counters of the host cache."""

    num_entries: int
    num_bytes: int
    num_hits: int
    num_misses: int
    num_fetches: int


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


class HostAdapterCache:
    """Adapter directories under cache_dir/<sha256>/, LRU-bounded by max_bytes (pinned entries stay)."""

    def __init__(self, cache_dir: Path, fetch: FetchFn, max_bytes: int = 8 << 30) -> None:
        self._dir = Path(cache_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._fetch = fetch
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self._entries: OrderedDict[str, int] = OrderedDict()  # sha256 -> bytes, LRU order (oldest first)
        self._pins: dict[str, int] = {}
        self._num_hits = self._num_misses = self._num_fetches = 0
        self._scan_existing()

    def _scan_existing(self) -> None:
        for entry in sorted(self._dir.iterdir(), key=lambda p: p.stat().st_mtime):
            if entry.is_dir() and (entry / WEIGHTS_NAME).exists() and (entry / CONFIG_NAME).exists():
                self._entries[entry.name] = _dir_bytes(entry)
            elif entry.name.startswith(".tmp-"):
                shutil.rmtree(entry, ignore_errors=True)

    def path_for(self, sha256: str) -> Path:
        """Where an adapter with this weights hash lives (whether or not it is cached)."""
        return self._dir / sha256

    def contains(self, sha256: str) -> bool:
        """True if the adapter is cached on this host."""
        with self._lock:
            return sha256 in self._entries

    def get(self, sha256: str, config_key: str, weights_key: str) -> Path:
        """Return the adapter's local directory, downloading it once if needed (blocking)."""
        while True:
            with self._lock:
                if sha256 in self._entries:
                    self._entries.move_to_end(sha256)
                    self._num_hits += 1
                    return self.path_for(sha256)
                event = self._inflight.get(sha256)
                if event is None:
                    event = threading.Event()
                    self._inflight[sha256] = event
                    self._num_misses += 1
                    break
            event.wait()  # another thread is downloading it; then re-check (it may have failed)
        try:
            self._download(sha256, config_key, weights_key)
        finally:
            with self._lock:
                self._inflight.pop(sha256, None)
            event.set()
        return self.path_for(sha256)

    def _download(self, sha256: str, config_key: str, weights_key: str) -> None:
        tmp = self._dir / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            self._fetch(config_key, tmp / CONFIG_NAME)
            self._fetch(weights_key, tmp / WEIGHTS_NAME)
            actual = sha256_file(tmp / WEIGHTS_NAME)
            if actual != sha256:
                raise ChecksumMismatchError(f"adapter weights hash {actual} != expected {sha256}")
            final = self.path_for(sha256)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        with self._lock:
            self._num_fetches += 1
            self._entries[sha256] = _dir_bytes(self.path_for(sha256))
            self._evict_over_budget(keep=sha256)

    def pin(self, sha256: str) -> None:
        """Keep an entry from eviction (while an engine has it loaded)."""
        with self._lock:
            self._pins[sha256] = self._pins.get(sha256, 0) + 1

    def unpin(self, sha256: str) -> None:
        """Release one pin."""
        with self._lock:
            count = self._pins.get(sha256, 0) - 1
            if count > 0:
                self._pins[sha256] = count
            else:
                self._pins.pop(sha256, None)
            self._evict_over_budget(keep=None)

    def _evict_over_budget(self, keep: str | None) -> None:
        # The entry just fetched (keep) is about to be used: it may push the cache over budget briefly.
        total = sum(self._entries.values())
        for sha in list(self._entries):
            if total <= self._max_bytes:
                break
            if sha in self._pins or sha == keep:
                continue
            total -= self._entries.pop(sha)
            shutil.rmtree(self.path_for(sha), ignore_errors=True)

    def stats(self) -> HostCacheStats:
        """Current counters."""
        with self._lock:
            return HostCacheStats(len(self._entries), sum(self._entries.values()), self._num_hits,
                                  self._num_misses, self._num_fetches)

    def cached(self) -> list[str]:
        """sha256 keys of cached adapters, least recently used first."""
        with self._lock:
            return list(self._entries)
