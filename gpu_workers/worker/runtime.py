"""A worker's lifecycle around its `WorkerService`: load, heartbeat, drain, deregister.

`WorkerRuntime` builds the service (loads the model) in a thread after the server is up (/ready is 503
until then), heartbeats a WorkerRecord into a WorkerDirectory, and drains: refuse new requests, let running
ones finish (bounded), deregister. It knows nothing of HTTP: the HTTP app (http_app.py) and the in-process
transport (inproc_transport.py) both ask it for the service with `require_service()`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from cluster.membership import WorkerDirectory
from gpu_workers.worker.worker_errors import DrainingError, OverloadedError
from gpu_workers.worker.worker_service import WorkerService

logger = logging.getLogger("lorahost.worker")


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
        stream_keepalive_s: float = 5.0,
    ) -> None:
        if not internal_token:
            raise ValueError("a worker needs an internal token; set LORAHOST_INTERNAL_TOKEN")
        self.internal_token = internal_token
        self.url = url
        self.directory = directory
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_ttl_s = heartbeat_ttl_s or 3 * heartbeat_interval_s
        self.drain_timeout_s = drain_timeout_s
        self.stream_keepalive_s = stream_keepalive_s  # a blank line in a generate stream silent this long
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

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the worker runs on (set by start()); the service's locks and streams live there."""
        return self._loop

    def adopt_service(self, service: WorkerService) -> None:
        """Serve a prebuilt service (tests) instead of building one; it is not shut down with the worker."""
        self.service = service
        self._shutdown_engine = False

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
        try:
            async with self._directory_lock:
                # The record is built under the lock: a beat that started before a drain cannot publish
                # is_draining=False after the drain's own beat.
                record = service.record(self.url, await service.engine_stats())
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
