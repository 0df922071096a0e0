"""The worker process (`lorahost worker`): uvicorn serving the worker's HTTP app, drained on SIGTERM.

`run_worker(settings, blobs=...)` binds the socket, builds the runtime (builder.py) and serves
`create_worker_app` (http_app.py) until SIGTERM/SIGINT, then drains and exits 0 (a second signal forces). The
blob store comes from the caller (`lorahost worker` builds it from Settings).

Where the rest of the worker lives:
- runtime.py: `WorkerRuntime`, the lifecycle (load in the background, heartbeat, drain, deregister).
- http_app.py: `create_worker_app`, the internal HTTP API of cluster/protocol.py.
- inproc_transport.py: `InProcessWorkerTransport`, the same generate call without HTTP (`lorahost serve`).
- embedded.py: `EmbeddedWorker`, the in-process worker of `lorahost serve` (uvicorn in a thread).
- builder.py: everything built from Settings (backend by name, service, directory, runtime); it wires the
  injected blob store (blob_source.py `BlobSource`) into the host adapter cache and the base model fetch.
- worker_service.py: what each call does (request streams, the worker's stats), without HTTP;
  adapter_manager.py: the host tier of adapter files; worker_errors.py: the errors a call reports.
"""

from __future__ import annotations

import gc
import logging
import socket
from typing import Any

import uvicorn

from gpu_workers.worker.blob_source import BlobSource
from gpu_workers.worker.builder import make_directory, make_runtime
from gpu_workers.worker.http_app import create_worker_app
from gpu_workers.worker.runtime import WorkerRuntime
from settings import Settings

logger = logging.getLogger("lorahost.worker")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 = a free port); uvicorn serves on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _DrainingServer(uvicorn.Server):
    """uvicorn that drains the worker on the first SIGTERM/SIGINT and exits on the second."""

    def __init__(self, config: uvicorn.Config, runtime: WorkerRuntime) -> None:
        super().__init__(config)
        self._runtime = runtime
        runtime.on_drained = self._exit

    def _exit(self) -> None:
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, then the objects alive (imports, the app, the runtime) exempted from later garbage
        collections: a full collection scans them all with the event loop (token streaming) stopped."""
        await super().startup(sockets)
        if not self.should_exit:
            gc.collect()
            gc.freeze()

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it after shutdown (exit code != 0).
        if self._runtime.is_draining:
            self.should_exit = self.force_exit = True
            return
        logger.info("signal %s: draining", sig)
        self._runtime.request_drain()


def run_worker(settings: Settings, *, blobs: BlobSource) -> None:
    """Serve a worker reading adapter and base model files from `blobs` until SIGTERM/SIGINT, then drain,
    deregister and return (blocking)."""
    if not settings.internal_token:
        raise ValueError("a worker needs LORAHOST_INTERNAL_TOKEN (the API servers send the same token)")
    sock = bind_socket(settings.worker.host, settings.worker.resolved_port())
    runtime = make_runtime(settings, sock, make_directory(settings), settings.internal_token, blobs=blobs)
    config = uvicorn.Config(create_worker_app(runtime), log_level="info", timeout_graceful_shutdown=5)
    _DrainingServer(config, runtime).run(sockets=[sock])
