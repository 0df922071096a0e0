"""Real workers for tests (no mocks): a worker subprocess, or an in-thread worker for speed.

A test harness, not product code: it builds the worker's blob store (registry/blob_locations.py) as the
`lorahost` commands do and stores adapters with registry/storage.py, which the engine side may not import. E.g.:

    from tests.worker_harness import worker_process, worker_in_thread

    def test_completion_streams(base_model_dir, tmp_path):
        blob_dir = tmp_path / "blobs"                       # the API's blob store (settings.storage.blob_store)
        with worker_in_thread(base_model_dir, blob_dir) as w:  # or worker_process(...) for a real process
            w.url            # "http://127.0.0.1:<port>" (already /ready)
            w.internal_token # send `Authorization: Bearer <token>`; put it in services.internal_token
            w.directory      # a WorkerDirectory with this worker registered (InMemory for in-thread; for a
                             # process pass redis_url=... to share a RedisWorkerDirectory, else it is None)
            w.settings       # the worker's Settings (blob_store = str(blob_dir))

Upload adapters through the API into the same blob directory and the worker fetches them from there by
AdapterRef (config_blob_key / weights_blob_key / sha256 / config_sha256). `put_adapter(blob_dir, name,
adapter_dir)` stores a PEFT directory directly and returns its AdapterRef (both digests filled in), for
tests that skip the upload path.

Both helpers wait for /ready (model loaded) before yielding and drain + stop on exit. `worker_process`
runs `python -m lorahost.cli worker` with LORAHOST_* environment variables: use it for signal/drain tests
and anything that must be a separate process; `worker_in_thread` is ~10x faster to start.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cluster.membership import InMemoryWorkerDirectory, WorkerDirectory
from cluster.protocol import INTERNAL_PREFIX, AdapterRef
from settings import Settings

# Small engine defaults so test workers start fast and use little memory.
TEST_ENGINE_SETTINGS: dict[str, Any] = {
    "engine_dtype": "float32",
    "engine_num_kv_blocks": 256,
    "engine_max_num_seqs": 16,
    "engine_num_threads": 1,
    "heartbeat_interval_s": 0.5,
    "drain_timeout_s": 20.0,
}


@dataclass
class RunningWorker:
    """A started, ready worker."""

    url: str
    internal_token: str
    settings: Settings
    directory: WorkerDirectory | None
    worker_id: str
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        """Authorization header for the internal API."""
        return {"Authorization": f"Bearer {self.internal_token}"}

    def client(self, **kwargs: Any) -> httpx.Client:
        """An httpx client bound to the worker with the token set."""
        return httpx.Client(base_url=self.url + INTERNAL_PREFIX, headers=self.headers, **kwargs)


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(app: Any, server_class: Any = None, **config: Any) -> Iterator[str]:
    """`app` under uvicorn (with `config`'s extra options; `server_class`: a uvicorn.Server subclass taking the
    config) on a free port, in a thread, until the block ends; yields its base URL."""
    import uvicorn

    port = free_port()
    make_server = server_class or uvicorn.Server
    server = make_server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def put_adapter(blob_dir: Path, name: str, adapter_dir: Path) -> AdapterRef:
    """Store a PEFT adapter directory in a local blob store under adapters/<name>/ and return its ref."""
    from gpu_workers.worker.host_cache import CONFIG_NAME, WEIGHTS_NAME
    from registry.digests import sha256_file
    from registry.storage import LocalBlobStore

    store = LocalBlobStore(blob_dir)
    config_key, weights_key = f"adapters/{name}/{CONFIG_NAME}", f"adapters/{name}/{WEIGHTS_NAME}"
    store.put_file(config_key, adapter_dir / CONFIG_NAME)
    store.put_file(weights_key, adapter_dir / WEIGHTS_NAME)
    return AdapterRef(
        adapter_key=name,
        sha256=sha256_file(adapter_dir / WEIGHTS_NAME),
        config_sha256=sha256_file(adapter_dir / CONFIG_NAME),
        config_blob_key=config_key,
        weights_blob_key=weights_key,
    )


def _settings(base_model_dir: Path, blob_dir: Path, data_dir: Path, token: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        **TEST_ENGINE_SETTINGS,
        "base_model_path": Path(base_model_dir),
        "blob_store": str(blob_dir),
        "data_dir": Path(data_dir),
        "internal_token": token,
    }
    values.update(overrides)
    return Settings(**values)


def wait_ready(
    url: str, token: str, timeout_s: float = 120.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll {url}/internal/v1/ready until 200; RuntimeError if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"worker process exited with {process.returncode} before it was ready")
        try:
            if httpx.get(f"{url}{INTERNAL_PREFIX}/ready", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"worker at {url} not ready after {timeout_s}s")


@contextmanager
def worker_in_thread(
    base_model_dir: Path,
    blob_dir: Path,
    *,
    data_dir: Path | None = None,
    internal_token: str | None = None,
    directory: WorkerDirectory | None = None,
    **settings_overrides: Any,
) -> Iterator[RunningWorker]:
    """A real worker (uvicorn + engine) in a thread of this process; yields once it is ready."""
    from gpu_workers.worker.embedded import EmbeddedWorker
    from registry.blob_locations import make_blob_store

    token = internal_token or secrets.token_urlsafe(16)
    data_dir = data_dir or Path(blob_dir).parent / f"worker-{secrets.token_hex(4)}"
    settings = _settings(base_model_dir, blob_dir, data_dir, token, **settings_overrides)
    worker = EmbeddedWorker(
        settings,
        directory if directory is not None else InMemoryWorkerDirectory(),
        blobs=make_blob_store(settings),
    )
    worker.start()
    try:
        worker.wait_ready()
        wait_ready(worker.url, token)
        service = worker.runtime.service
        assert service is not None
        yield RunningWorker(
            url=worker.url,
            internal_token=token,
            settings=settings,
            directory=worker.directory,
            worker_id=service.worker_id,
            extra={"embedded": worker},
        )
    finally:
        worker.stop()


@contextmanager
def worker_process(
    base_model_dir: Path,
    blob_dir: Path,
    *,
    data_dir: Path | None = None,
    internal_token: str | None = None,
    redis_url: str | None = None,
    worker_id: str | None = None,
    **settings_overrides: Any,
) -> Iterator[RunningWorker]:
    """`python -m lorahost.cli worker` on a free port; yields once /ready; SIGTERM + wait on exit.

    With redis_url the worker registers in Redis and `directory` is a RedisWorkerDirectory on it (pass
    worker_key_prefix=... to isolate tests). Logs go to <data_dir>/worker.log.
    """
    from gpu_workers.worker.builder import make_directory

    token = internal_token or secrets.token_urlsafe(16)
    port = free_port()
    data_dir = Path(data_dir or Path(blob_dir).parent / f"worker-{port}")
    data_dir.mkdir(parents=True, exist_ok=True)
    worker_id = worker_id or f"test-worker-{port}"
    overrides = {"worker_port": port, "worker_id": worker_id, "redis_url": redis_url, **settings_overrides}
    settings = _settings(base_model_dir, blob_dir, data_dir, token, **overrides)
    log_path = data_dir / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "lorahost.cli", "worker"],
            env={**os.environ, **settings.env_vars()},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, token, process=process)
        yield RunningWorker(
            url=url,
            internal_token=token,
            settings=settings,
            directory=make_directory(settings) if redis_url else None,
            worker_id=worker_id,
            process=process,
            log_path=log_path,
        )
    except BaseException:
        sys.stderr.write(log_path.read_text(errors="replace")[-4000:])
        raise
    finally:
        stop_process(process)


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """SIGTERM (drain), wait, SIGKILL if it hangs; returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)
