"""Blob stores on a local directory and on a real S3 HTTP API (moto server)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from registry.blob_locations import make_blob_store, parse_s3_uri
from registry.s3_storage import S3BlobStore
from registry.storage import BlobNotFoundError, BlobStore, LocalBlobStore
from settings import Settings

MIB = 1024 * 1024
MULTIPART_CHUNK = 5 * MIB  # S3's minimum part size


class _ChunkedReader(io.RawIOBase):
    """A non-seekable stream that yields `num_bytes` of a repeating pattern, never all in memory."""

    def __init__(self, num_bytes: int) -> None:
        self.remaining = num_bytes
        self.pattern = bytes(range(256)) * 4096

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        n = min(len(buffer), self.remaining, len(self.pattern))
        buffer[:n] = self.pattern[:n]
        self.remaining -= n
        return n


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    """The same tests against both implementations."""
    if request.param == "local":
        yield LocalBlobStore(tmp_path / "blobs")
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    yield S3BlobStore(bucket, "prefix/dir", endpoint_url=endpoint, multipart_chunk_bytes=MULTIPART_CHUNK)


def test_round_trips_bytes_through_every_read_path(store: BlobStore, tmp_path: Path) -> None:
    assert store.put_stream("a/b/file.bin", io.BytesIO(b"hello")) == 5
    with store.open("a/b/file.bin") as f:
        assert f.read() == b"hello"
    store.download_to("a/b/file.bin", tmp_path / "out" / "file.bin")
    assert (tmp_path / "out" / "file.bin").read_bytes() == b"hello"
    assert store.exists("a/b/file.bin") and store.size("a/b/file.bin") == 5


def test_streams_a_multipart_upload_larger_than_5_mib(store: BlobStore, tmp_path: Path) -> None:
    num_bytes = 2 * MULTIPART_CHUNK + 123
    assert store.put_stream("big.bin", _ChunkedReader(num_bytes)) == num_bytes
    assert store.size("big.bin") == num_bytes
    store.download_to("big.bin", tmp_path / "big.bin")
    expected = _ChunkedReader(num_bytes).read()
    assert (tmp_path / "big.bin").read_bytes() == expected
    if isinstance(store, S3BlobStore):
        head = store.client.head_object(Bucket=store.bucket, Key=store._key("big.bin"))
        assert head["ETag"].strip('"').endswith("-3")  # three parts: a real multipart upload


def test_delete_removes_the_key_and_is_idempotent(store: BlobStore) -> None:
    store.put_stream("x/y.bin", io.BytesIO(b"1"))
    store.delete("x/y.bin")
    store.delete("x/y.bin")
    assert not store.exists("x/y.bin")
    assert store.list_keys() == []


def test_missing_key_raises_blob_not_found(store: BlobStore, tmp_path: Path) -> None:
    with pytest.raises(BlobNotFoundError), store.open("nope"):
        pass
    with pytest.raises(BlobNotFoundError):
        store.size("nope")
    with pytest.raises(BlobNotFoundError):
        store.download_to("nope", tmp_path / "nope")
    with pytest.raises(BlobNotFoundError):
        store.copy("nope", "other")
    assert not (tmp_path / "nope").exists()


def test_copy_and_move_between_keys(store: BlobStore) -> None:
    store.put_stream("src.bin", io.BytesIO(b"data"))
    store.copy("src.bin", "copy.bin")
    store.move("src.bin", "moved/dst.bin")
    assert store.list_keys() == ["copy.bin", "moved/dst.bin"]
    with store.open("moved/dst.bin") as f:
        assert f.read() == b"data"


def test_lists_and_deletes_by_prefix(store: BlobStore) -> None:
    for key in ("uploads/1/a", "uploads/1/b", "adapters/t/a"):
        store.put_stream(key, io.BytesIO(b"."))
    assert store.list_keys("uploads/") == ["uploads/1/a", "uploads/1/b"]
    store.delete_prefix("uploads/")
    assert store.list_keys() == ["adapters/t/a"]


def test_lists_keys_with_their_last_modified_time(store: BlobStore) -> None:
    before = datetime.now(UTC) - timedelta(seconds=5)  # S3 keeps whole seconds; allow clock skew to moto
    for key in ("uploads/1/a", "uploads/1/b", "adapters/t/a"):
        store.put_stream(key, io.BytesIO(b"."))
    after = datetime.now(UTC) + timedelta(seconds=5)
    listed = store.list_keys_with_mtime("uploads/")
    assert [key for key, _ in listed] == ["uploads/1/a", "uploads/1/b"]
    assert all(before <= modified_at <= after and modified_at.tzinfo is not None for _, modified_at in listed)
    assert [key for key, _ in store.list_keys_with_mtime()] == store.list_keys()


def test_local_mtime_is_the_files_modification_time(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    store.put_stream("uploads/v/f", io.BytesIO(b"."))
    long_ago = datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)
    os.utime(tmp_path / "uploads/v/f", (long_ago.timestamp(), long_ago.timestamp()))
    assert store.list_keys_with_mtime() == [("uploads/v/f", long_ago)]


def test_local_partial_writes_older_than_the_cutoff_are_deleted(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    store.put_stream("uploads/v/kept", io.BytesIO(b"."))
    old, alone = tmp_path / "uploads/v/.tmp-old.part", tmp_path / "uploads/a/b/.tmp-alone.part"
    young = tmp_path / "uploads/w/.tmp-young.part"
    for path in (old, alone, young):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")  # what a writer killed mid-put_stream leaves
    os.utime(old, (0, 0))
    os.utime(alone, (0, 0))  # its folders are pruned while the walk goes on
    cutoff = datetime.now(UTC) - timedelta(minutes=1)
    assert store.delete_partial_writes("adapters/", cutoff) == []
    assert store.delete_partial_writes("uploads/", cutoff) == [
        "uploads/a/b/.tmp-alone.part",
        "uploads/v/.tmp-old.part",
    ]
    assert not old.exists() and young.exists() and store.list_keys() == ["uploads/v/kept"]
    assert not (tmp_path / "uploads/a").exists()


def test_s3_incomplete_multipart_uploads_are_aborted(s3_endpoint: str, s3_bucket: str) -> None:
    store = S3BlobStore(s3_bucket, "prefix", endpoint_url=s3_endpoint)
    started = store.client.create_multipart_upload(Bucket=s3_bucket, Key="prefix/uploads/v/weights")
    store.client.upload_part(  # a writer killed mid-upload_fileobj: parts sent, never completed
        Bucket=s3_bucket,
        Key="prefix/uploads/v/weights",
        UploadId=started["UploadId"],
        PartNumber=1,
        Body=b"x",
    )
    initiated = store.client.list_multipart_uploads(Bucket=s3_bucket)["Uploads"][0]["Initiated"]
    # moto reports a fixed Initiated time (2010), so "younger than the cutoff" is checked against that time.
    assert store.delete_partial_writes("uploads/", initiated - timedelta(seconds=1)) == []
    assert store.delete_partial_writes("adapters/", datetime.now(UTC) + timedelta(hours=1)) == []
    assert store.delete_partial_writes("uploads/", datetime.now(UTC) + timedelta(hours=1)) == [
        "uploads/v/weights"
    ]
    assert store.client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


@pytest.mark.parametrize("key", ["", "/abs", "../escape", "a/../b", "a//b"])
def test_refuses_keys_that_escape_the_store(store: BlobStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.put_stream(key, io.BytesIO(b"x"))


def test_local_write_failure_leaves_no_partial_file(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)

    class Broken(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
            raise OSError("client went away")

    store.put_stream("k", io.BytesIO(b"old"))
    with pytest.raises(OSError):
        store.put_stream("k", Broken())
    assert store.open("k").__enter__().read() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["k"]


def test_make_blob_store_picks_s3_for_s3_uris_and_local_otherwise(tmp_path: Path) -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    s3 = make_blob_store(Settings(data_dir=tmp_path, blob_store="s3://bucket/some/prefix"))
    assert isinstance(s3, S3BlobStore) and (s3.bucket, s3.prefix) == ("bucket", "some/prefix")
    local = make_blob_store(Settings(data_dir=tmp_path))
    assert isinstance(local, LocalBlobStore) and local.root == (tmp_path / "blobs").resolve()


def test_parse_s3_uri_rejects_non_s3() -> None:
    assert parse_s3_uri("s3://b") == ("b", "")
    with pytest.raises(ValueError):
        parse_s3_uri("http://b/x")
    with pytest.raises(ValueError):
        parse_s3_uri("s3:///x")
