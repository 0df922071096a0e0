"""The worker HTTP process: the internal API of cluster/protocol.py over one engine.

The only engine-side module that touches the blob store: `build_worker_service` injects the blob store's
`download_to` into the host adapter cache. Per-call behaviour lives in worker_service.py.

- `create_worker_app(runtime)`: the FastAPI app (every route needs `Authorization: Bearer <token>`).
- `WorkerRuntime`: builds the service (loads the model) after the server is up — /ready is 503 until then —
  heartbeats a WorkerRecord into a WorkerDirectory, and drains: refuse new requests, let running ones
  finish (bounded), deregister.
- `run_worker(settings)`: `lorahost worker`; SIGTERM/SIGINT drain then exit 0 (a second signal forces).
- `EmbeddedWorker`: the in-process worker of `lorahost serve` (uvicorn in a thread, its own event loop).
- `InProcessWorkerTransport`: the embedded worker's generate call without HTTP (the API's
  `api.worker_client.LocalWorkerTransport`): the worker side runs on the worker's own event loop and the
  events cross to the caller's loop through a thread-safe queue bridge.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import logging
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from gpu_workers.worker_service import (
    DrainingError,
    OverloadedError,
    PreparedRequest,
    WorkerError,
    WorkerService,
)
from cluster.membership import InMemoryWorkerDirectory, WorkerDirectory, WorkerRecord
from registry.settings import Settings
from cluster.protocol import (
    INTERNAL_PREFIX,
    AdapterRef,
    GenerateEvent,
    GenerateRequest,
    WorkerRefusedError,
    WorkerStats,
)

logger = logging.getLogger("lorahost.worker")

NDJSON = "application/x-ndjson"


class WorkerRuntime:
    """A worker's lifecycle around its service: load, heartbeat, drain, deregister."""

    def __init__(
        self,
        build_service: Callable[[], WorkerService],
        *,
        internal_token: str,
        url: str,
        directory: WorkerDirectory | None = None,
        heartbeat_interval_s: float = 2.0,
        heartbeat_ttl_s: float | None = None,
        drain_timeout_s: float = 30.0,
        shutdown_engine: bool = True,
    ) -> None:
        if not internal_token:
            raise ValueError("a worker needs an internal token; set LORAHOST_INTERNAL_TOKEN")
        self.internal_token = internal_token
        self.url = url
        self.directory = directory
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_ttl_s = heartbeat_ttl_s or 3 * heartbeat_interval_s
        self.drain_timeout_s = drain_timeout_s
        self.service: WorkerService | None = None
        self.load_error: str | None = None
        self.on_drained: Callable[[], None] | None = None  # run_worker: tell uvicorn to exit
        self._build_service = build_service
        self._shutdown_engine = shutdown_engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._is_draining = False
        self._is_deregistered = False
        self._directory_lock = asyncio.Lock()  # a heartbeat in flight never lands after deregistration

    @property
    def is_draining(self) -> bool:
        """True once a drain started (new requests are refused)."""
        return self._is_draining

    # ---- lifecycle (called from the app lifespan) ----------------------------------------------------

    async def start(self) -> None:
        """Load the service in the background; heartbeats start once it is ready."""
        self._loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.create_task(self._load_then_heartbeat()))

    async def _load_then_heartbeat(self) -> None:
        service = self.service
        if service is None:
            try:
                service = await asyncio.to_thread(self._build_service)
            except Exception as exc:  # reported by /ready; the process stays up to say why
                self.load_error = f"{type(exc).__name__}: {exc}"
                logger.exception("worker failed to load its engine")
                return
        service.is_draining = self._is_draining
        await self.heartbeat(service)  # registered before /ready says 200
        self.service = service
        logger.info("worker %s ready at %s", service.worker_id, self.url)
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            await self.heartbeat()

    async def heartbeat(self, service: WorkerService | None = None) -> None:
        """Advertise the current record (no-op without a directory, before load or after deregistering)."""
        service = service or self.service
        if self.directory is None or service is None:
            return
        record = service.record(self.url, await service.engine_stats())
        try:
            async with self._directory_lock:
                if not self._is_deregistered:
                    await asyncio.to_thread(self.directory.heartbeat, record, self.heartbeat_ttl_s)
        except Exception:  # a directory outage must not kill the worker; the next beat retries
            logger.exception("heartbeat failed")

    async def drain(self) -> bool:
        """Refuse new requests, wait (bounded) for running ones, deregister; True if all finished."""
        self._is_draining = True
        is_clean = True
        if self.service is not None:
            self.service.is_draining = True
            await self.heartbeat()  # routers see is_draining now, not at the next beat
            is_clean = await self.service.drain(self.drain_timeout_s)
            if not is_clean:
                logger.warning("drain timeout: %d requests still running", self.service.num_active)
        await self.deregister()
        return is_clean

    def request_drain(self) -> None:
        """Start a drain from any thread or a signal handler; on_drained runs when it is done."""
        if self._loop is None:
            if self.on_drained:
                self.on_drained()
            return
        self._loop.call_soon_threadsafe(self._start_drain_task)

    def _start_drain_task(self) -> None:
        async def drain_then_notify() -> None:
            await self.drain()
            if self.on_drained:
                self.on_drained()

        self._tasks.append(asyncio.create_task(drain_then_notify()))

    async def deregister(self) -> None:
        """Remove this worker from the directory (idempotent)."""
        async with self._directory_lock:
            if self._is_deregistered:
                return
            self._is_deregistered = True
        if self.directory is not None and self.service is not None:
            try:
                await asyncio.to_thread(self.directory.remove, self.service.worker_id)
            except Exception:  # the TTL removes it anyway
                logger.exception("deregistration failed")

    async def stop(self) -> None:
        """Deregister, stop heartbeats and shut the engine down."""
        await self.deregister()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.service is not None and self._shutdown_engine:
            await asyncio.to_thread(self.service.engine.shutdown)

    # ---- per request ---------------------------------------------------------------------------------

    def require_service(self) -> WorkerService:
        """The loaded service, or a WorkerError saying why there is none."""
        if self._is_draining:
            raise DrainingError("worker is draining; send the request to another worker")
        if self.service is None:
            reason = (
                f"failed to load: {self.load_error}" if self.load_error else "still loading the base model"
            )
            raise OverloadedError(f"worker is not ready ({reason}); retry or route elsewhere")
        return self.service


# ---- HTTP -------------------------------------------------------------------------------------------


def error_response(status_code: int, code: str, message: str) -> JSONResponse:
    """The worker's error shape: {"error": {"type": code, "message": ...}}."""
    return JSONResponse({"error": {"type": code, "message": message}}, status_code=status_code)


def _auth_dependency(token: str) -> Callable[[Request], None]:
    expected = token.encode()

    def require_internal_token(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), expected):
            raise _Unauthorized()

    return require_internal_token


class _Unauthorized(Exception):
    pass


def create_worker_app(runtime: WorkerRuntime) -> FastAPI:
    """The worker's FastAPI app (internal API; see cluster/protocol.py)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(title="lorahost worker", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runtime = runtime
    _install_error_handlers(app)
    app.include_router(_router(runtime))
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(WorkerError)
    async def worker_error(_: Request, exc: WorkerError) -> JSONResponse:
        return error_response(exc.status_code, exc.code, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, "bad_request", f"invalid request body: {exc.errors()}")

    @app.exception_handler(_Unauthorized)
    async def unauthorized(_: Request, __: _Unauthorized) -> JSONResponse:
        return error_response(
            401, "unauthorized", "missing or invalid internal token (Authorization: Bearer)"
        )


def _router(runtime: WorkerRuntime) -> APIRouter:
    router = APIRouter(
        prefix=INTERNAL_PREFIX, dependencies=[Depends(_auth_dependency(runtime.internal_token))]
    )

    @router.post("/generate")
    async def generate(body: GenerateRequest) -> StreamingResponse:
        received_at = time.time()
        service = runtime.require_service()
        prepared = await service.prepare(body, received_at)
        return StreamingResponse(
            _ndjson(service, prepared),
            media_type=NDJSON,
            background=BackgroundTask(_release, service, prepared),
        )

    @router.post("/adapters/prefetch")
    async def prefetch(ref: AdapterRef) -> dict[str, str]:
        service = runtime.require_service()
        key = await service.adapters.acquire(ref)
        service.adapters.release(key)
        return {"adapter_key": key, "residency": service.adapters.residency(key)}

    @router.post("/adapters/drop")
    async def drop(body: dict[str, str]) -> dict[str, bool]:
        if not isinstance(body.get("adapter_key"), str):
            return error_response(400, "bad_request", 'send {"adapter_key": "<key>"}')  # type: ignore[return-value]
        service = runtime.require_service()
        return {"dropped": await service.adapters.drop(body["adapter_key"])}

    @router.get("/stats")
    async def stats() -> WorkerStats:
        service = runtime.require_service()
        return service.stats(await service.engine_stats())

    @router.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/ready")
    async def ready() -> JSONResponse:
        if runtime.service is not None and not runtime.is_draining:
            return JSONResponse({"status": "ready"})
        status = "draining" if runtime.is_draining else ("failed" if runtime.load_error else "loading")
        return JSONResponse({"status": status, "detail": runtime.load_error}, status_code=503)

    return router


async def _release(service: WorkerService, prepared: PreparedRequest) -> None:
    """Release the request's lease even if the stream never started (async: stays on the event loop)."""
    service.finish(prepared)


async def _ndjson(service: WorkerService, prepared: PreparedRequest) -> AsyncIterator[bytes]:
    async for event in service.stream(prepared):
        yield (event.model_dump_json(exclude_defaults=True) + "\n").encode()


# ---- in process ---------------------------------------------------------------------------------------

_END = object()  # the pump finished (after the terminal event, or after a refusal)


class _InProcessStream:
    """One generate stream bridged from the worker's loop (producer) to the caller's loop (consumer).

    The worker side puts events, a WorkerRefusedError (refused before streaming) and then _END; the caller
    reads them with next_event(). aclose() before the terminal event cancels the worker-side task, which
    closes the service stream and so aborts the engine request (what closing the HTTP stream does).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self.future: concurrent.futures.Future[None] | asyncio.Future[None] | None = None

    def put(self, item: object) -> None:
        """Hand an item to the caller's loop (called on the worker's loop)."""
        try:
            if _running_loop() is self._loop:
                self._queue.put_nowait(item)
            else:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody reads this stream any more
            pass

    async def next_event(self) -> GenerateEvent | None:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # stays ended
            return None
        if isinstance(item, WorkerRefusedError):
            raise item
        return item  # type: ignore[return-value]

    async def aclose(self, has_ended: bool) -> None:
        if self.future is not None and not has_ended and not self.future.done():
            self.future.cancel()  # thread-safe: cancels the pump task on the worker's loop


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class InProcessWorkerTransport:
    """The embedded worker's generate call for an API in the same process (no HTTP, no token).

    Implements `api.worker_client.LocalWorkerTransport`. The worker-side logic (require_service, prepare,
    stream, finish) is exactly the HTTP route's and runs on the worker's event loop, where the service's
    locks, events and engine streams live; refusals carry the HTTP route's code and status.
    """

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime

    def serves(self, worker: WorkerRecord) -> bool:
        """True for this worker's own record (it advertises the runtime's URL)."""
        return worker.url == self.runtime.url

    async def open_stream(self, request: GenerateRequest) -> _InProcessStream:
        """Start the request on the worker's loop; events (or a refusal) arrive through next_event()."""
        worker_loop = self.runtime._loop
        if worker_loop is None or worker_loop.is_closed():
            raise WorkerRefusedError("overloaded", "the in-process worker is not running", 503)
        caller_loop = asyncio.get_running_loop()
        stream = _InProcessStream(caller_loop)
        pump = _pump(self.runtime, request, stream)
        if worker_loop is caller_loop:
            stream.future = asyncio.ensure_future(pump)
        else:
            stream.future = asyncio.run_coroutine_threadsafe(pump, worker_loop)
        return stream


async def _pump(runtime: WorkerRuntime, request: GenerateRequest, sink: _InProcessStream) -> None:
    """The worker side of one in-process generate call (the HTTP route's logic, events to `sink`)."""
    received_at = time.time()
    try:
        try:
            service = runtime.require_service()
            prepared = await service.prepare(request, received_at)
        except WorkerError as exc:
            sink.put(WorkerRefusedError(exc.code, str(exc), exc.status_code))
            return
        except Exception as exc:
            logger.exception("in-process generate failed before streaming")
            sink.put(WorkerRefusedError("internal", f"{type(exc).__name__}: {exc}", 500))
            return
        try:
            async with aclosing(service.stream(prepared)) as events:  # type: ignore[type-var]
                async for event in events:
                    sink.put(event)
        finally:
            service.finish(prepared)
    finally:
        sink.put(_END)


# ---- building a worker from settings ------------------------------------------------------------------


def build_worker_service(settings: Settings, *, worker_id: str) -> WorkerService:
    """Load the base model into an AsyncLLMEngine and wire the host cache to the blob store (blocking)."""
    from gpu_workers.async_engine import AsyncLLMEngine
    from gpu_workers.host_cache import HostAdapterCache
    from registry.storage import make_blob_store

    if settings.base_model_path is None:
        raise ValueError("no base model: set LORAHOST_BASE_MODEL_PATH or pass --base-model")
    config = engine_config_from_settings(settings)
    blob_store = make_blob_store(settings)
    host_cache = HostAdapterCache(
        settings.resolved_host_cache_dir(), blob_store.download_to, max_bytes=settings.host_cache_max_bytes
    )
    engine = AsyncLLMEngine.from_config(config)
    return WorkerService(
        engine,
        host_cache,
        worker_id=worker_id,
        base_model=settings.base_model_name,
        max_loaded_adapters=settings.max_loaded_adapters,
        max_num_seqs=config.max_num_seqs,
    )


def engine_config_from_settings(settings: Settings) -> Any:
    """The frozen EngineConfig for this worker."""
    from gpu_workers.config import EngineConfig

    return EngineConfig(
        model_path=settings.base_model_path,  # type: ignore[arg-type]
        dtype=settings.engine_dtype,
        device=settings.engine_device,
        kv_cache_bytes=settings.engine_kv_cache_bytes,
        num_kv_blocks=settings.engine_num_kv_blocks,
        max_num_seqs=settings.engine_max_num_seqs,
        max_num_batched_tokens=settings.engine_max_num_batched_tokens,
        max_model_len=settings.engine_max_model_len,
        max_lora_rank=settings.max_rank,
        max_loaded_adapters=max(settings.max_loaded_adapters, 1),
        adapter_cache_bytes=settings.engine_adapter_cache_bytes,
        batch_policy=settings.engine_batch_policy,
        num_threads=settings.engine_num_threads,
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 = a free port); uvicorn serves on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def advertise_url(settings: Settings, port: int) -> str:
    """The URL API servers use: settings.worker_advertise_url, else http://<host>:<port>."""
    if settings.worker_advertise_url:
        return settings.worker_advertise_url.rstrip("/")
    host = settings.worker_host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"http://{host}:{port}"


def make_directory(settings: Settings) -> WorkerDirectory:
    """RedisWorkerDirectory when settings.redis_url is set, else a process-local in-memory one."""
    if not settings.redis_url:
        return InMemoryWorkerDirectory()
    import redis

    from cluster.membership import RedisWorkerDirectory

    return RedisWorkerDirectory(
        redis.Redis.from_url(settings.redis_url), key_prefix=settings.worker_key_prefix
    )


def make_runtime(
    settings: Settings, sock: socket.socket, directory: WorkerDirectory | None, internal_token: str
) -> WorkerRuntime:
    """A runtime for a worker listening on `sock` (its id defaults to <hostname>-<port>)."""
    port = sock.getsockname()[1]
    worker_id = settings.worker_id or f"{socket.gethostname()}-{port}"
    return WorkerRuntime(
        lambda: build_worker_service(settings, worker_id=worker_id),
        internal_token=internal_token,
        url=advertise_url(settings, port),
        directory=directory,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        heartbeat_ttl_s=settings.resolved_heartbeat_ttl_s(),
        drain_timeout_s=settings.drain_timeout_s,
    )


class _DrainingServer(uvicorn.Server):
    """uvicorn that drains the worker on the first SIGTERM/SIGINT and exits on the second."""

    def __init__(self, config: uvicorn.Config, runtime: WorkerRuntime) -> None:
        super().__init__(config)
        self._runtime = runtime
        runtime.on_drained = self._exit

    def _exit(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it after shutdown (exit code != 0).
        if self._runtime.is_draining:
            self.should_exit = self.force_exit = True
            return
        logger.info("signal %s: draining", sig)
        self._runtime.request_drain()


def run_worker(settings: Settings) -> None:
    """Serve a worker until SIGTERM/SIGINT, then drain, deregister and return (blocking)."""
    if not settings.internal_token:
        raise ValueError("a worker needs LORAHOST_INTERNAL_TOKEN (the API servers send the same token)")
    sock = bind_socket(settings.worker_host, settings.resolved_worker_port())
    runtime = make_runtime(settings, sock, make_directory(settings), settings.internal_token)
    config = uvicorn.Config(create_worker_app(runtime), log_level="info", timeout_graceful_shutdown=5)
    _DrainingServer(config, runtime).run(sockets=[sock])


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

    `start()` returns once the port listens; the model loads in the background (/ready says when).
    The token is settings.internal_token, or a generated one. The port is settings.worker_port when it was
    set (LORAHOST_WORKER_PORT), else a free one.
    """

    def __init__(
        self,
        settings: Settings,
        directory: WorkerDirectory | None = None,
        *,
        service: WorkerService | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.internal_token = settings.internal_token or secrets.token_urlsafe(32)
        self.directory = directory if directory is not None else InMemoryWorkerDirectory()
        self._sock = bind_socket(host, settings.resolved_worker_port(default=0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.runtime = make_runtime(
            settings.model_copy(update={"worker_advertise_url": self.url}),
            self._sock,
            self.directory,
            self.internal_token,
        )
        if service is not None:  # a prebuilt service (tests): not shut down with the worker
            self.runtime.service = service
            self.runtime._shutdown_engine = False
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
        """Drain (bounded by settings.drain_timeout_s), deregister and stop the thread."""
        if drain and self._thread.is_alive():
            done = threading.Event()
            self.runtime.on_drained = done.set
            self.runtime.request_drain()
            done.wait(self.runtime.drain_timeout_s + 5)
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()
