"""Host disk cache of adapter files, keyed by what the files are: both digests, or the version id.

An entry's key is `AdapterFiles.cache_key`: "c-" + adapter_content_digest(weights sha256, config sha256)
when the version's config digest is known, else "v-" + sha256(version key) — a version validated before
config digests were recorded is never shared with another version. Keying by the weights alone would let
two versions with identical weights and different adapter_config.json (lora_alpha 32 vs 4000, other
tenants) share one cached config. With an owner (`AdapterFiles.owner_id`, the tenant that owns the adapter)
the content key is scoped to it ("o-" + owner_scoped_digest): identical files of two tenants get two entries,
so one tenant's cold start never runs faster because another tenant has the same adapter (a timing channel
that would tell it that someone else uses those files). Versions of one owner still share an entry.

A worker fetches an adapter's files from the blob store once: concurrent requests for one key wait for the
one download in progress. Files are downloaded into a temporary directory, both files' sha256 are checked
(ChecksumMismatchError for either), a manifest of the digests is written, and only then is the directory
renamed into place — a reader never sees a partial or unverified adapter. On startup only entries of this
layout whose manifest matches their name and config file are kept; anything else (an older cache keyed by
the weights' sha256 alone, a partial download) is deleted.
The fetch function is injected (gpu_workers/worker/builder.py passes the injected blob store's `download_to`),
so this module does no I/O of its own beyond the local cache directory.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from registry.digests import adapter_content_digest, owner_scoped_digest, sha256_file
from scheduler.core.byte_budget_lru import ByteBudgetLRU

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
MANIFEST_NAME = "manifest.json"  # cache_dir/<key>/manifest.json beside cache_dir/<key>/adapter/
FILES_DIR_NAME = "adapter"  # exactly the adapter's two files (what the engine loads)
CONTENT_PREFIX = "c-"  # keyed by the content digest of both files
OWNER_CONTENT_PREFIX = "o-"  # keyed by the content digest of both files within one owner's scope
VERSION_PREFIX = "v-"  # keyed by the version (its config digest is unknown)

FetchFn = Callable[[str, Path], None]  # (blob key, destination file path) -> None


class ChecksumMismatchError(RuntimeError):
    """A downloaded file does not hash to the expected sha256 (corrupt or tampered blob)."""


@dataclass(frozen=True)
class AdapterFiles:
    """Where one adapter version's two files are and the digests they must have."""

    version_key: str  # unique per version (the engine adapter id)
    weights_sha256: str
    config_sha256: str | None  # None for versions validated before config digests were recorded
    config_blob_key: str
    weights_blob_key: str
    owner_id: str | None = None  # the tenant owning the adapter: entries are shared only within one owner

    @property
    def cache_key(self) -> str:
        """The entry name: the content digest of both files (scoped to the owner when known), else one
        derived from the version key."""
        if self.config_sha256 and self.weights_sha256:
            return content_cache_key(self.weights_sha256, self.config_sha256, self.owner_id)
        return VERSION_PREFIX + hashlib.sha256(self.version_key.encode()).hexdigest()


def content_cache_key(weights_sha256: str, config_sha256: str, owner_id: str | None) -> str:
    """The entry name of an adapter known by both digests: owner-scoped when `owner_id` is given."""
    content = adapter_content_digest(weights_sha256, config_sha256)
    if owner_id:
        return OWNER_CONTENT_PREFIX + owner_scoped_digest(content, owner_id)
    return CONTENT_PREFIX + content


@dataclass(frozen=True)
class HostCacheStats:
    """Counters of the host cache."""

    num_entries: int
    num_bytes: int
    num_hits: int
    num_misses: int
    num_fetches: int


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _check_sha256(path: Path, expected: str) -> str:
    """The file's sha256; ChecksumMismatchError unless it equals `expected`."""
    actual = sha256_file(path)
    if actual != expected.lower():
        raise ChecksumMismatchError(
            f"checksum mismatch: {path.name} has sha256 {actual}, expected {expected} "
            "(corrupt or tampered blob)"
        )
    return actual


def _write_manifest(
    entry: Path, key: str, weights_sha256: str, config_sha256: str, owner_id: str | None
) -> None:
    manifest = {
        "cache_key": key,
        "weights_sha256": weights_sha256,
        "config_sha256": config_sha256,
        "owner_id": owner_id,
    }
    (entry / MANIFEST_NAME).write_text(json.dumps(manifest))


def _is_valid_entry(entry: Path) -> bool:
    """True for a complete entry of this layout whose manifest matches its name and its config file.

    The weights were verified before the entry was renamed into place; the small config is re-hashed.
    """
    files = entry / FILES_DIR_NAME
    try:
        manifest = json.loads((entry / MANIFEST_NAME).read_text())
        if manifest.get("cache_key") != entry.name or not (files / WEIGHTS_NAME).is_file():
            return False
        if entry.name.startswith((CONTENT_PREFIX, OWNER_CONTENT_PREFIX)):
            owner_id = manifest.get("owner_id") if entry.name.startswith(OWNER_CONTENT_PREFIX) else None
            expected = content_cache_key(manifest["weights_sha256"], manifest["config_sha256"], owner_id)
            if entry.name != expected:
                return False
        elif not entry.name.startswith(VERSION_PREFIX):
            return False
        return sha256_file(files / CONFIG_NAME) == manifest["config_sha256"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


class HostAdapterCache:
    """Adapter directories under cache_dir/<cache key>/adapter/, LRU-bounded by max_bytes (pins stay;
    scheduler/core/byte_budget_lru.py keeps the order, sizes and pins)."""

    def __init__(self, cache_dir: Path, fetch: FetchFn, max_bytes: int = 8 << 30) -> None:
        self._dir = Path(cache_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._fetch = fetch
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self._entries = ByteBudgetLRU(max_bytes)  # cache key -> bytes, guarded by _lock
        self._num_hits = self._num_misses = self._num_fetches = 0
        self._scan_existing()

    def _scan_existing(self) -> None:
        """Keep the valid entries of this layout (oldest first); delete everything else that is a folder."""
        for entry in sorted(self._dir.iterdir(), key=lambda p: p.stat().st_mtime):
            if not entry.is_dir():
                continue
            if _is_valid_entry(entry):
                self._entries.put(entry.name, _dir_bytes(entry))
            else:  # a partial download, or an entry of an older layout (e.g. keyed by weights only)
                shutil.rmtree(entry, ignore_errors=True)

    def path_for(self, key: str) -> Path:
        """The adapter directory of the entry with this cache key (whether or not it is cached)."""
        return self._entry_dir(key) / FILES_DIR_NAME

    def _entry_dir(self, key: str) -> Path:
        return self._dir / key

    def contains(self, key: str) -> bool:
        """True if the entry with this cache key is cached on this host."""
        with self._lock:
            return key in self._entries

    def get(self, files: AdapterFiles) -> Path:
        """Return the adapter's verified local directory, downloading it once if needed (blocking).

        Raises ChecksumMismatchError if a downloaded file does not have its expected sha256.
        """
        key = files.cache_key
        while True:
            with self._lock:
                if self._entries.touch(key):
                    self._num_hits += 1
                    return self.path_for(key)
                event = self._inflight.get(key)
                if event is None:
                    event = threading.Event()
                    self._inflight[key] = event
                    self._num_misses += 1
                    break
            event.wait()  # another thread is downloading it; then re-check (it may have failed)
        try:
            self._download(key, files)
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            event.set()
        return self.path_for(key)

    def _download(self, key: str, files: AdapterFiles) -> None:
        tmp = self._dir / f".tmp-{uuid.uuid4().hex}"
        (tmp / FILES_DIR_NAME).mkdir(parents=True)
        try:
            self._fetch_verified(files, tmp)
            final = self._entry_dir(key)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        with self._lock:
            self._num_fetches += 1
            self._entries.put(key, _dir_bytes(self._entry_dir(key)))
            self._evict_over_budget(keep=key)

    def _fetch_verified(self, files: AdapterFiles, entry: Path) -> None:
        """Download both files into entry/adapter/, check both digests, then write the manifest."""
        adapter_dir = entry / FILES_DIR_NAME
        self._fetch(files.config_blob_key, adapter_dir / CONFIG_NAME)
        self._fetch(files.weights_blob_key, adapter_dir / WEIGHTS_NAME)
        weights_sha256 = _check_sha256(adapter_dir / WEIGHTS_NAME, files.weights_sha256)
        if files.config_sha256:
            config_sha256 = _check_sha256(adapter_dir / CONFIG_NAME, files.config_sha256)
        else:  # a version without a recorded config digest: its entry is its own (v- key)
            config_sha256 = sha256_file(adapter_dir / CONFIG_NAME)
        _write_manifest(entry, files.cache_key, weights_sha256, config_sha256, files.owner_id)

    def pin(self, key: str) -> None:
        """Keep an entry from eviction (while an engine has it loaded)."""
        with self._lock:
            self._entries.pin(key)

    def unpin(self, key: str) -> None:
        """Release one pin."""
        with self._lock:
            self._entries.unpin(key)
            self._evict_over_budget(keep=None)

    def _evict_over_budget(self, keep: str | None) -> None:
        # The entry just fetched (keep) is about to be used: it may push the cache over budget briefly.
        for key in self._entries.evict_over_budget(keep):
            shutil.rmtree(self._entry_dir(key), ignore_errors=True)

    def stats(self) -> HostCacheStats:
        """Current counters."""
        with self._lock:
            return HostCacheStats(
                len(self._entries),
                self._entries.num_bytes,
                self._num_hits,
                self._num_misses,
                self._num_fetches,
            )

    def cached(self) -> list[str]:
        """Cache keys of cached adapters, least recently used first."""
        with self._lock:
            return self._entries.keys()
