import hashlib
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_workers.worker.host_cache import AdapterFiles, ChecksumMismatchError, HostAdapterCache

CONFIG_A, CONFIG_B = b'{"r": 4, "lora_alpha": 32}', b'{"r": 4, "lora_alpha": 4000}'


def _sha(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def _adapter(
    name: str,
    weights: bytes,
    config: bytes = CONFIG_A,
    *,
    has_config_digest: bool = True,
    owner_id: str | None = None,
) -> tuple[dict[str, bytes], AdapterFiles]:
    """The blobs of one adapter version and its AdapterFiles (config digest omitted like a pre-0002 row)."""
    blobs = {f"{name}/config": config, f"{name}/weights": weights}
    files = AdapterFiles(
        version_key=name,
        weights_sha256=_sha(weights),
        config_sha256=_sha(config) if has_config_digest else None,
        config_blob_key=f"{name}/config",
        weights_blob_key=f"{name}/weights",
        owner_id=owner_id,
    )
    return blobs, files


class CountingFetch:
    """Writes the blob and records the key; with `release`, each fetch first waits until it is set."""

    def __init__(self, blobs: dict[str, bytes], release: threading.Event | None = None) -> None:
        self.blobs, self.release, self.calls = blobs, release, []
        self.lock = threading.Lock()

    def __call__(self, key: str, dest: Path) -> None:
        with self.lock:
            self.calls.append(key)
        if self.release is not None:
            assert self.release.wait(timeout=30)
        dest.write_bytes(self.blobs[key])


def _served(path: Path) -> tuple[bytes, bytes]:
    return (path / "adapter_config.json").read_bytes(), (path / "adapter_model.safetensors").read_bytes()


def _num_waiting_in_get(threads: list[threading.Thread]) -> int:
    """How many of `threads` wait in HostAdapterCache.get for another thread's download (their stacks say so)."""
    frames = sys._current_frames()
    num_waiting = 0
    for thread in threads:
        frame = frames.get(thread.ident or -1)
        names = []
        while frame is not None:
            names.append((Path(frame.f_code.co_filename).name, frame.f_code.co_name))
            frame = frame.f_back
        num_waiting += ("host_cache.py", "get") in names and ("threading.py", "wait") in names
    return num_waiting


def test_concurrent_gets_of_one_adapter_download_once(tmp_path: Path) -> None:
    """The first get downloads; the download is held until the 7 others provably wait for it (no timing)."""
    blobs, files = _adapter("a", b"w" * 1000)
    release = threading.Event()
    fetch = CountingFetch(blobs, release=release)
    cache = HostAdapterCache(tmp_path / "cache", fetch)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(files))) for _ in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while _num_waiting_in_get(threads) < 7:
        assert time.monotonic() < deadline, "the other gets never waited for the download"
        time.sleep(0.001)
    release.set()
    for t in threads:
        t.join()
    assert fetch.calls == ["a/config", "a/weights"]
    assert len(set(results)) == 1
    assert sorted(p.name for p in results[0].iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert _served(results[0]) == (CONFIG_A, b"w" * 1000)
    stats = cache.stats()
    assert stats.num_fetches == 1 and stats.num_misses == 1 and stats.num_hits == 7


def test_weights_checksum_mismatch_leaves_nothing_cached(tmp_path: Path) -> None:
    blobs, files = _adapter("a", b"payload")
    wrong = AdapterFiles("a", "0" * 64, files.config_sha256, files.config_blob_key, files.weights_blob_key)
    cache = HostAdapterCache(tmp_path / "cache", CountingFetch(blobs))
    with pytest.raises(ChecksumMismatchError, match="adapter_model.safetensors"):
        cache.get(wrong)
    assert not cache.contains(wrong.cache_key)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_tampered_config_blob_raises_checksum_mismatch_and_leaves_nothing_cached(tmp_path: Path) -> None:
    blobs, files = _adapter("a", b"payload", CONFIG_A)
    blobs["a/config"] = CONFIG_B  # same weights, the config swapped in the blob store
    cache = HostAdapterCache(tmp_path / "cache", CountingFetch(blobs))
    with pytest.raises(ChecksumMismatchError, match="adapter_config.json"):
        cache.get(files)
    assert not cache.contains(files.cache_key)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_same_weights_with_another_config_get_their_own_entry(tmp_path: Path) -> None:
    blobs_b, tenant_b = _adapter("tenant-b", b"same weights", CONFIG_A)
    blobs_c, tenant_c = _adapter("tenant-c", b"same weights", CONFIG_B)
    cache = HostAdapterCache(tmp_path / "cache", CountingFetch({**blobs_b, **blobs_c}))
    path_b, path_c = cache.get(tenant_b), cache.get(tenant_c)
    assert path_b != path_c
    assert _served(path_b) == (CONFIG_A, b"same weights")
    assert _served(path_c) == (CONFIG_B, b"same weights")


def test_identical_files_of_two_versions_share_one_entry(tmp_path: Path) -> None:
    blobs_1, first = _adapter("v1", b"same weights", CONFIG_A)
    blobs_2, second = _adapter("v2", b"same weights", CONFIG_A)
    fetch = CountingFetch({**blobs_1, **blobs_2})
    cache = HostAdapterCache(tmp_path / "cache", fetch)
    assert cache.get(first) == cache.get(second)
    assert fetch.calls == ["v1/config", "v1/weights"]


def test_identical_files_of_two_owners_get_their_own_entries(tmp_path: Path) -> None:
    """Tenant A's copy of tenant B's exact files is downloaded again: A's cold start cannot tell (by being
    faster) that B's adapter is cached on this worker."""
    blobs_b, of_b = _adapter("b-v1", b"same weights", CONFIG_A, owner_id="tenant-b")
    blobs_a, of_a = _adapter("a-v1", b"same weights", CONFIG_A, owner_id="tenant-a")
    blobs_b2, of_b2 = _adapter("b-v2", b"same weights", CONFIG_A, owner_id="tenant-b")
    fetch = CountingFetch({**blobs_b, **blobs_a, **blobs_b2})
    cache = HostAdapterCache(tmp_path / "cache", fetch)
    path_b = cache.get(of_b)
    assert cache.get(of_a) != path_b
    assert cache.get(of_b2) == path_b  # one owner's versions still share
    assert fetch.calls == ["b-v1/config", "b-v1/weights", "a-v1/config", "a-v1/weights"]
    assert not cache.contains(_adapter("x", b"same weights", CONFIG_A, owner_id="tenant-c")[1].cache_key)


def test_owner_scoped_entries_survive_restart_and_a_renamed_entry_does_not(tmp_path: Path) -> None:
    blobs, files = _adapter("a", b"x" * 10, owner_id="tenant-a")
    HostAdapterCache(tmp_path / "cache", CountingFetch(blobs)).get(files)
    fetch = CountingFetch(blobs)
    assert _served(HostAdapterCache(tmp_path / "cache", fetch).get(files)) == (CONFIG_A, b"x" * 10)
    assert fetch.calls == []
    _, other_owner = _adapter("a", b"x" * 10, owner_id="tenant-b")
    (tmp_path / "cache" / files.cache_key).rename(tmp_path / "cache" / other_owner.cache_key)
    assert HostAdapterCache(tmp_path / "cache", fetch).cached() == []  # its manifest names another owner


def test_versions_without_a_config_digest_never_share_an_entry(tmp_path: Path) -> None:
    blobs_b, tenant_b = _adapter("tenant-b", b"same weights", CONFIG_A, has_config_digest=False)
    blobs_c, tenant_c = _adapter("tenant-c", b"same weights", CONFIG_B, has_config_digest=False)
    cache = HostAdapterCache(tmp_path / "cache", CountingFetch({**blobs_b, **blobs_c}))
    assert _served(cache.get(tenant_b)) == (CONFIG_A, b"same weights")
    assert _served(cache.get(tenant_c)) == (CONFIG_B, b"same weights")
    assert tenant_b.cache_key != tenant_c.cache_key


def test_lru_eviction_skips_pinned_entries(tmp_path: Path) -> None:
    blobs_a, files_a = _adapter("a", b"a" * 600)
    blobs_b, files_b = _adapter("b", b"b" * 600)
    a, b = files_a.cache_key, files_b.cache_key
    cache = HostAdapterCache(tmp_path / "cache", CountingFetch({**blobs_a, **blobs_b}), max_bytes=1000)
    cache.get(files_a)
    cache.pin(a)
    cache.get(files_b)
    assert cache.contains(a) and cache.contains(b)  # a pinned, b just fetched: both kept
    cache.unpin(a)  # a is now the least recently used unpinned entry: evicted
    assert cache.cached() == [b]
    assert (cache.path_for(b) / "adapter_model.safetensors").exists()
    assert not (tmp_path / "cache" / a).exists()


def test_cache_survives_restart(tmp_path: Path) -> None:
    blobs, files = _adapter("a", b"x" * 10)
    HostAdapterCache(tmp_path / "cache", CountingFetch(blobs)).get(files)
    fetch = CountingFetch(blobs)
    again = HostAdapterCache(tmp_path / "cache", fetch)
    assert _served(again.get(files)) == (CONFIG_A, b"x" * 10)
    assert fetch.calls == []


def test_restart_discards_an_entry_keyed_by_the_weights_alone(tmp_path: Path) -> None:
    """An older cache stored <weights sha256>/ with tenant B's config; tenant C (same weights) gets C's."""
    weights = b"same weights"
    old_entry = tmp_path / "cache" / _sha(weights)
    old_entry.mkdir(parents=True)
    (old_entry / "adapter_config.json").write_bytes(CONFIG_A)
    (old_entry / "adapter_model.safetensors").write_bytes(weights)
    blobs, tenant_c = _adapter("tenant-c", weights, CONFIG_B)
    fetch = CountingFetch(blobs)

    cache = HostAdapterCache(tmp_path / "cache", fetch)

    assert not old_entry.exists() and cache.cached() == []
    assert _served(cache.get(tenant_c)) == (CONFIG_B, weights)
    assert fetch.calls == ["tenant-c/config", "tenant-c/weights"]


def test_restart_discards_an_entry_whose_config_was_changed_on_disk(tmp_path: Path) -> None:
    blobs, files = _adapter("a", b"weights", CONFIG_A)
    path = HostAdapterCache(tmp_path / "cache", CountingFetch(blobs)).get(files)
    (path / "adapter_config.json").write_bytes(CONFIG_B)
    fetch = CountingFetch(blobs)
    again = HostAdapterCache(tmp_path / "cache", fetch)
    assert again.cached() == []
    assert _served(again.get(files)) == (CONFIG_A, b"weights")
    assert fetch.calls == ["a/config", "a/weights"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    versions=st.lists(
        st.tuples(
            st.sampled_from([b"w1", b"w2" * 300]), st.sampled_from([CONFIG_A, CONFIG_B]), st.booleans()
        ),
        min_size=1,
        max_size=6,
    ),
    gets=st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=20),
)
def test_every_get_serves_exactly_the_files_of_the_requested_version(
    tmp_path_factory: pytest.TempPathFactory,
    versions: list[tuple[bytes, bytes, bool]],
    gets: list[tuple[int, bool]],
) -> None:
    """Versions sharing weights and/or configs, small LRU budget, random restarts: never another's files."""
    cache_dir = tmp_path_factory.mktemp("cache")
    blobs: dict[str, bytes] = {}
    refs = []
    for i, (weights, config, has_digest) in enumerate(versions):
        version_blobs, files = _adapter(f"v{i}", weights, config, has_config_digest=has_digest)
        blobs.update(version_blobs)
        refs.append((files, config, weights))
    cache = HostAdapterCache(cache_dir, CountingFetch(blobs), max_bytes=700)
    for index, restart in gets:
        if restart:
            cache = HostAdapterCache(cache_dir, CountingFetch(blobs), max_bytes=700)
        files, config, weights = refs[index % len(refs)]
        assert _served(cache.get(files)) == (config, weights)
