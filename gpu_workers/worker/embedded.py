"""The in-process worker of `lorahost serve` (and of tests): uvicorn on 127.0.0.1 in a daemon thread.

`EmbeddedWorker` runs the worker's HTTP app (http_app.py) on its own event loop in a thread and offers the
API server in the same process an `InProcessWorkerTransport` (inproc_transport.py) to reach it without HTTP.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import uvicorn

from cluster.membership import InMemoryWorkerDirectory, WorkerDirectory
from gpu_workers.worker.blob_source import BlobSource
from gpu_workers.worker.builder import make_runtime
from gpu_workers.worker.http_app import create_worker_app
from gpu_workers.worker.inproc_transport import InProcessWorkerTransport
from gpu_workers.worker.server import bind_socket
from gpu_workers.worker.worker_service import WorkerService
from settings import Settings


class _QuietThread(logging.Filter):
    """Drops uvicorn's info records logged from one thread (uvicorn's loggers are process-wide, so the
    embedded worker's startup lines would otherwise repeat the API server's)."""

    def __init__(self, thread_name: str) -> None:
        super().__init__()
        self.thread_name = thread_name

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.threadName != self.thread_name


_EMBEDDED_THREAD_NAME = "lorahost-worker"
_EMBEDDED_LOG_FILTER = _QuietThread(_EMBEDDED_THREAD_NAME)


class EmbeddedWorker:
    """An in-process worker for `lorahost serve` and tests: uvicorn on 127.0.0.1 in a daemon thread.

    `start()` returns once the port listens; the model loads in the background (/ready says when), its adapter
    and base model files read from `blobs` (the caller builds the blob store from Settings).
    The token is settings.internal_token, or a generated one. The port is settings.worker.port when it was
    set (LORAHOST_WORKER_PORT), else a free one.
    """

    def __init__(
        self,
        settings: Settings,
        directory: WorkerDirectory | None = None,
        *,
        blobs: BlobSource,
        service: WorkerService | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.internal_token = settings.internal_token or secrets.token_urlsafe(32)
        self.directory = directory if directory is not None else InMemoryWorkerDirectory()
        self._sock = bind_socket(host, settings.worker.resolved_port(default=0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.runtime = make_runtime(
            settings.updated(worker_advertise_url=self.url),
            self._sock,
            self.directory,
            self.internal_token,
            blobs=blobs,
        )
        if service is not None:  # a prebuilt service (tests): not shut down with the worker
            self.runtime.adopt_service(service)
        self.transport = InProcessWorkerTransport(self.runtime)  # the API's path to this worker (no HTTP)
        config = uvicorn.Config(create_worker_app(self.runtime), log_config=None, lifespan="on")
        self._server = uvicorn.Server(config)
        for name in ("uvicorn.error", "uvicorn.access"):
            logging.getLogger(name).addFilter(_EMBEDDED_LOG_FILTER)  # the same object: added once
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=_EMBEDDED_THREAD_NAME, daemon=True
        )

    def start(self) -> EmbeddedWorker:
        """Start serving (returns immediately)."""
        self._thread.start()
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until the engine is loaded; RuntimeError if it failed or timed out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.runtime.service is not None and self._server.started:
                return
            if self.runtime.load_error:
                raise RuntimeError(f"embedded worker failed to load: {self.runtime.load_error}")
            time.sleep(0.05)
        raise RuntimeError(f"embedded worker not ready after {timeout_s}s")

    def stop(self, drain: bool = True) -> None:
        """Drain (bounded by settings.worker.drain_timeout_s), deregister and stop the thread."""
        if drain and self._thread.is_alive():
            done = threading.Event()
            self.runtime.on_drained = done.set
            self.runtime.request_drain()
            done.wait(self.runtime.drain_timeout_s + 5)
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()
