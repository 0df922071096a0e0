"""The embedded worker's generate call without HTTP, for an API server in the same process.

`InProcessWorkerTransport` implements `api.worker_client.LocalWorkerTransport`: the worker side (the HTTP
route's logic: require_service, prepare, stream, finish) runs on the worker's own event loop and the events
cross to the caller's loop through a thread-safe queue bridge (`_InProcessStream`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from contextlib import aclosing

from cluster.membership import WorkerRecord
from cluster.protocol import WORKER_ERROR_STATUS, GenerateEvent, GenerateRequest, WorkerRefusedError
from gpu_workers.worker.runtime import WorkerRuntime
from gpu_workers.worker.worker_errors import WorkerError

logger = logging.getLogger("lorahost.worker")

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
        worker_loop = self.runtime.event_loop
        if worker_loop is None or worker_loop.is_closed():
            message = "the in-process worker is not running"
            raise WorkerRefusedError("overloaded", message, WORKER_ERROR_STATUS["overloaded"])
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
            message = f"{type(exc).__name__}: {exc}"
            sink.put(WorkerRefusedError("internal", message, WORKER_ERROR_STATUS["internal"]))
            return
        try:
            async with aclosing(service.stream(prepared)) as events:  # type: ignore[type-var]
                async for event in events:
                    sink.put(event)
        finally:
            service.finish(prepared)
    finally:
        sink.put(_END)
