"""LORAHOST_WORKER_PORT: honoured by the in-process worker of `lorahost serve` when set, else a free port."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gpu_workers.worker.embedded import EmbeddedWorker
from registry.storage import LocalBlobStore
from settings import Settings
from settings.worker import DEFAULT_WORKER_PORT
from tests.worker_harness import free_port


def _serve_health(worker: EmbeddedWorker) -> int:
    worker.start()
    try:
        return httpx.get(
            f"{worker.url}/internal/v1/health", headers={"Authorization": "Bearer t"}
        ).status_code
    finally:
        worker.stop(drain=False)


def test_embedded_worker_binds_the_configured_worker_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port = free_port()
    monkeypatch.setenv("LORAHOST_WORKER_PORT", str(port))
    worker = EmbeddedWorker(Settings(internal_token="t"), blobs=LocalBlobStore(tmp_path / "blobs"))
    assert worker.port == port and worker.url == f"http://127.0.0.1:{port}"
    assert _serve_health(worker) == 200


def test_embedded_worker_picks_a_free_port_when_none_is_configured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LORAHOST_WORKER_PORT", raising=False)
    worker = EmbeddedWorker(Settings(internal_token="t"), blobs=LocalBlobStore(tmp_path / "blobs"))
    assert worker.port not in (0, DEFAULT_WORKER_PORT)
    assert _serve_health(worker) == 200


def test_standalone_worker_port_defaults_to_8100_and_zero_means_free() -> None:
    assert Settings().worker.resolved_port() == DEFAULT_WORKER_PORT == 8100
    assert Settings(worker_port=0).worker.resolved_port() == 0
    assert Settings(worker_port=9001).worker.resolved_port(default=0) == 9001
