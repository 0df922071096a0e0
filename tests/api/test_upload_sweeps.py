"""The API's share of upload housekeeping: per-instance upload scratch folders, emptied at start, and the
inline upload-sweep timer (embedded mode)."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from api.uploads import remove_abandoned_upload_dirs, upload_scratch_dir
from registry.storage import LocalBlobStore
from settings import Settings
from tests.api.conftest import TenantHandle, adapter_paths, num_timer_threads, upload


def test_upload_scratch_folders_live_under_the_data_dir_per_instance(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, api_instance_id="pod/0")
    assert upload_scratch_dir(settings) == tmp_path / "upload-tmp" / "pod_0"
    elsewhere = Settings(data_dir=tmp_path, upload_tmp_dir=tmp_path / "scratch", api_instance_id="a")
    assert (
        upload_scratch_dir(elsewhere) == tmp_path / "scratch" / "a" and (tmp_path / "scratch" / "a").is_dir()
    )


def test_start_removes_only_this_instances_abandoned_scratch_folders(tmp_path: Path) -> None:
    mine, other = (
        Settings(data_dir=tmp_path, api_instance_id="a"),
        Settings(data_dir=tmp_path, api_instance_id="b"),
    )
    (upload_scratch_dir(mine) / "lorahost-upload-x").mkdir()
    (upload_scratch_dir(mine) / "lorahost-upload-x" / "adapter_model.safetensors").write_bytes(b"half")
    (upload_scratch_dir(other) / "lorahost-upload-y").mkdir()  # another replica's upload in progress
    assert [p.name for p in remove_abandoned_upload_dirs(mine)] == ["lorahost-upload-x"]
    assert list(upload_scratch_dir(mine).iterdir()) == []
    assert [p.name for p in upload_scratch_dir(other).iterdir()] == ["lorahost-upload-y"]


def test_an_upload_is_received_in_the_instances_scratch_folder_and_leaves_it_empty(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle], demo_adapter: Path,
    tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:  # fmt: skip
    import api.upload_request as routes

    seen: list[Path] = []
    real = routes.upload_scratch_dir
    monkeypatch.setattr(routes, "upload_scratch_dir", lambda s: seen.append(real(s)) or seen[-1])
    client = make_client(api_instance_id="api-1")
    response = upload(client, new_tenant("acme"), "lora", adapter_paths(demo_adapter))
    assert response.status_code == 202, response.text
    assert seen == [tmp_path / "upload-tmp" / "api-1"] and list(seen[0].iterdir()) == []


def test_inline_timer_deletes_an_old_orphaned_staging_blob(
    make_client: Callable[..., TestClient], blob_store: LocalBlobStore
) -> None:
    blob_store.put_stream("uploads/no-row/adapter_config.json", io.BytesIO(b"{}"))
    blob_store.put_stream("other/kept.bin", io.BytesIO(b"."))
    os.utime(blob_store.root / "uploads/no-row/adapter_config.json", (0, 0))
    before = num_timer_threads("upload-sweep")
    make_client(upload_sweep_interval_s=0.05, orphan_blob_min_age_s=60)
    assert num_timer_threads("upload-sweep") == before + 1
    deadline = time.monotonic() + 30
    while blob_store.list_keys("uploads/") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert blob_store.list_keys() == ["other/kept.bin"]


def test_a_zero_interval_turns_the_inline_upload_timer_off(
    make_client: Callable[..., TestClient], blob_store: LocalBlobStore
) -> None:
    blob_store.put_stream("uploads/no-row/adapter_config.json", io.BytesIO(b"{}"))
    os.utime(blob_store.root / "uploads/no-row/adapter_config.json", (0, 0))
    before = num_timer_threads("upload-sweep")
    make_client(upload_sweep_interval_s=0)
    assert num_timer_threads("upload-sweep") == before  # no timer was started, so no sweep will ever run
    assert blob_store.list_keys() == ["uploads/no-row/adapter_config.json"]
