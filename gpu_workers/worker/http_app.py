"""The worker's HTTP app: the internal API of cluster/protocol.py over a `WorkerRuntime`.

`create_worker_app(runtime)` is a FastAPI app (every route needs `Authorization: Bearer <token>`): POST
/generate (an NDJSON stream of GenerateEvents, with a blank keepalive line after each
settings.worker.stream_keepalive_s of silence: gpu_workers/worker/stream_keepalive.py), /adapters/prefetch, /adapters/drop, GET /stats, /health and
/ready; the app's lifespan starts and stops the runtime. Errors are {"error": {"type", "message"}}.
Per-call behaviour lives in worker_service.py.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from cluster.protocol import INTERNAL_PREFIX, WORKER_ERROR_STATUS, AdapterRef, GenerateRequest, WorkerStats
from gpu_workers.worker.runtime import WorkerRuntime
from gpu_workers.worker.stream_keepalive import with_keepalive
from gpu_workers.worker.worker_errors import WorkerError
from gpu_workers.worker.worker_service import WorkerService
from scheduler.core.engine_request import EngineRequest

NDJSON = "application/x-ndjson"


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
        message = f"invalid request body: {exc.errors()}"
        return error_response(WORKER_ERROR_STATUS["bad_request"], "bad_request", message)

    @app.exception_handler(_Unauthorized)
    async def unauthorized(_: Request, __: _Unauthorized) -> JSONResponse:
        return error_response(
            WORKER_ERROR_STATUS["unauthorized"],
            "unauthorized",
            "missing or invalid internal token (Authorization: Bearer)",
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
            with_keepalive(_ndjson(service, prepared), runtime.stream_keepalive_s),
            media_type=NDJSON,
            background=BackgroundTask(_release, service, prepared),
        )

    @router.post("/adapters/prefetch")
    async def prefetch(ref: AdapterRef) -> dict[str, str]:
        service = runtime.require_service()
        return {"adapter_key": ref.adapter_key, "residency": await service.adapters.prefetch(ref)}

    @router.post("/adapters/drop")
    async def drop(body: dict[str, str]) -> dict[str, bool]:
        if not isinstance(body.get("adapter_key"), str):
            status = WORKER_ERROR_STATUS["bad_request"]
            return error_response(status, "bad_request", 'send {"adapter_key": "<key>"}')  # type: ignore[return-value]
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


async def _release(service: WorkerService, prepared: EngineRequest) -> None:
    """Release the request's lease even if the stream never started (async: stays on the event loop)."""
    service.finish(prepared)


async def _ndjson(service: WorkerService, prepared: EngineRequest) -> AsyncIterator[bytes]:
    async for event in service.stream(prepared):
        yield (event.model_dump_json(exclude_defaults=True) + "\n").encode()
