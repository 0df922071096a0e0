import hashlib
import threading
import time
from pathlib import Path

import pytest

from gpu_workers.host_cache import ChecksumMismatchError, HostAdapterCache


def _blobs(tmp_path: Path, name: str, payload: bytes) -> tuple[dict[str, bytes], str]:
    blobs = {f"{name}/config": b'{"r": 4}', f"{name}/weights": payload}
    return blobs, hashlib.sha256(payload).hexdigest()


class CountingFetch:
    def __init__(self, blobs: dict[str, bytes], delay_s: float = 0.0) -> None:
        self.blobs, self.delay_s, self.calls = blobs, delay_s, []
        self.lock = threading.Lock()

    def __call__(self, key: str, dest: Path) -> None:
        with self.lock:
            self.calls.append(key)
        time.sleep(self.delay_s)
        dest.write_bytes(self.blobs[key])


def test_concurrent_gets_of_one_adapter_download_once(tmp_path: Path) -> None:
    blobs, sha = _blobs(tmp_path, "a", b"w" * 1000)
    fetch = CountingFetch(blobs, delay_s=0.05)
    cache = HostAdapterCache(tmp_path / "cache", fetch)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(sha, "a/config", "a/weights")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fetch.calls == ["a/config", "a/weights"]
    assert len(set(results)) == 1
    assert (results[0] / "adapter_model.safetensors").read_bytes() == b"w" * 1000
    stats = cache.stats()
    assert stats.num_fetches == 1 and stats.num_misses == 1 and stats.num_hits == 7


def test_checksum_mismatch_leaves_nothing_cached(tmp_path: Path) -> None:
    blobs, _ = _blobs(tmp_path, "a", b"payload")
    cache = HostAdapterCache(tmp_path / "cache", CountingFetch(blobs))
    with pytest.raises(ChecksumMismatchError):
        cache.get("0" * 64, "a/config", "a/weights")
    assert not cache.contains("0" * 64)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_lru_eviction_skips_pinned_entries(tmp_path: Path) -> None:
    blobs_a, sha_a = _blobs(tmp_path, "a", b"a" * 600)
    blobs_b, sha_b = _blobs(tmp_path, "b", b"b" * 600)
    cache = HostAdapterCache(tmp_path / "cache", CountingFetch({**blobs_a, **blobs_b}), max_bytes=1000)
    cache.get(sha_a, "a/config", "a/weights")
    cache.pin(sha_a)
    cache.get(sha_b, "b/config", "b/weights")
    assert cache.contains(sha_a) and cache.contains(sha_b)  # a pinned, b just fetched: both kept
    cache.unpin(sha_a)  # a is now the least recently used unpinned entry: evicted
    assert cache.cached() == [sha_b]
    assert (cache.path_for(sha_b) / "adapter_model.safetensors").exists()


def test_cache_survives_restart(tmp_path: Path) -> None:
    blobs, sha = _blobs(tmp_path, "a", b"x" * 10)
    HostAdapterCache(tmp_path / "cache", CountingFetch(blobs)).get(sha, "a/config", "a/weights")
    fetch = CountingFetch(blobs)
    again = HostAdapterCache(tmp_path / "cache", fetch)
    again.get(sha, "a/config", "a/weights")
    assert fetch.calls == []
