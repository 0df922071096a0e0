"""A worker's base model fetched from the blob store by name (gpu_workers/worker/base_model_fetch.py): verified
against the catalog manifest's digests, fetched once, resumed file by file, refused with a clear message when a
blob is corrupt, the manifest is missing or the disk is too small; a worker with no local model serves it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from cluster.protocol import GenerateEvent, GenerateRequest, WorkerStats
from gpu_workers.worker.base_model_fetch import BaseModelFetchError, fetch_base_model
from registry.base_model_catalog import model_files
from registry.base_model_manifest import ModelFile, dump_manifest, file_key, manifest_key
from registry.digests import sha256_file
from registry.storage import LocalBlobStore
from tests.worker_harness import worker_in_thread

NAME = "tiny-a"


def _publish(store: LocalBlobStore, model_dir: Path, name: str = NAME) -> list[ModelFile]:
    """What `lorahost models add` stores: each file by content, then the manifest."""
    files = []
    for path in model_files(model_dir):
        digest = sha256_file(path)
        store.put_file(file_key(name, digest, path.name), path)
        files.append(ModelFile(path.name, digest, path.stat().st_size, file_key(name, digest, path.name)))
    store.put_stream(manifest_key(name), io.BytesIO(dump_manifest(name, files)))
    return files


class CountingStore:
    def __init__(self, store: LocalBlobStore) -> None:
        self.store = store
        self.fetched: list[str] = []

    def read_manifest(self, name: str = NAME) -> bytes | None:
        key = manifest_key(name)
        if not self.store.exists(key):
            return None
        with self.store.open(key) as f:
            return bytes(f.read())

    def fetch(self, key: str, dest: Path) -> None:
        self.fetched.append(key)
        self.store.download_to(key, dest)


def test_the_model_is_fetched_verified_and_then_reused(base_model_dir: Path, tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    files = _publish(store, base_model_dir)
    counting = CountingStore(store)
    path = fetch_base_model(NAME, counting.read_manifest, counting.fetch, tmp_path / "cache")
    for f in files:
        assert sha256_file(path / f.path) == sha256_file(base_model_dir / f.path)
    assert sorted(counting.fetched) == sorted(f.blob_key for f in files)
    counting.fetched.clear()
    assert fetch_base_model(NAME, counting.read_manifest, counting.fetch, tmp_path / "cache") == path
    assert counting.fetched == []  # fetched once per machine


def test_a_corrupt_blob_is_refused_and_the_fetch_resumes_once_it_is_fixed(
    base_model_dir: Path, tmp_path: Path
) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    files = _publish(store, base_model_dir)
    weights = next(f for f in files if f.path == "model.safetensors")
    good = (base_model_dir / "model.safetensors").read_bytes()
    store.put_stream(weights.blob_key, io.BytesIO(b"x" * len(good)))  # replaced behind the catalog's back
    counting = CountingStore(store)
    with pytest.raises(BaseModelFetchError, match="model.safetensors .* has sha256 .* expected"):
        fetch_base_model(NAME, counting.read_manifest, counting.fetch, tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("model.safetensors*"))  # nothing unverified left in place
    verified_before = set(counting.fetched) - {weights.blob_key}
    assert verified_before  # the files in order before the weights were fetched and verified
    store.put_stream(weights.blob_key, io.BytesIO(good))
    counting.fetched.clear()
    path = fetch_base_model(NAME, counting.read_manifest, counting.fetch, tmp_path / "cache")
    assert counting.fetched[0] == weights.blob_key
    assert verified_before.isdisjoint(counting.fetched)  # resumed: the verified files are not fetched again
    assert sha256_file(path / "model.safetensors") == weights.sha256


def test_too_little_disk_is_a_clear_error_before_any_download(base_model_dir: Path, tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    _publish(store, base_model_dir)
    counting = CountingStore(store)
    with pytest.raises(BaseModelFetchError, match=r"needs .* GB more at .* only 0\.00 GB are free"):
        fetch_base_model(
            NAME, counting.read_manifest, counting.fetch, tmp_path / "cache", free_bytes=lambda _: 1000
        )
    assert counting.fetched == []


def test_a_model_missing_from_the_catalog_says_how_to_add_it(tmp_path: Path) -> None:
    counting = CountingStore(LocalBlobStore(tmp_path / "blobs"))
    with pytest.raises(BaseModelFetchError, match="lorahost models add other"):
        fetch_base_model("other", lambda: counting.read_manifest("other"), counting.fetch, tmp_path / "cache")


def test_a_worker_without_a_local_model_serves_the_catalogs(base_model_dir: Path, tmp_path: Path) -> None:
    blob_dir = tmp_path / "blobs"
    _publish(LocalBlobStore(blob_dir), base_model_dir)
    with worker_in_thread(base_model_dir, blob_dir, base_model_path=None, base_model_name=NAME) as worker:
        body = GenerateRequest(
            request_id="r1",
            prompt="hello world",
            sampling={"max_tokens": 4, "temperature": 0, "ignore_eos": True},
        ).model_dump(mode="json")
        with worker.client(timeout=60) as client:
            response = client.post("/generate", json=body)
            stats = WorkerStats.model_validate(client.get("/stats").json())
    events = [GenerateEvent.model_validate_json(line) for line in response.text.splitlines() if line]
    assert events[-1].type == "final" and events[-1].num_output_tokens == 4
    assert stats.base_model == NAME
    assert any((worker.settings.data_dir / "base-models").rglob("model.safetensors"))
