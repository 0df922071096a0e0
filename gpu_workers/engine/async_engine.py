"""AsyncLLMEngine: a background thread steps the engine while work exists; asyncio callers stream deltas.

Threading: one lock guards the engine; the loop thread holds it for one `step()` at a time, other callers
(add/abort/load/unload from any thread) take it between steps. Deltas are handed to each request's asyncio
queue with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.errors import request_error
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.outputs import RequestOutput
from scheduler.core.engine_request import EngineRequest
from scheduler.core.engine_stats import EngineStats


class AsyncLLMEngine:
    """Thread-safe streaming wrapper around LLMEngine (implements backend.InferenceBackend)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)
        self._streams: dict[
            str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput | BaseException]]
        ] = {}
        self._is_stopped = False
        self._pending_pins: deque[tuple[str, bool]] = (
            deque()
        )  # (adapter_id, is_pin), appended from any thread
        self._thread = threading.Thread(target=self._run, name="lorahost-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncLLMEngine:
        """Build the engine (loads the model) and start the loop thread."""
        return cls(LLMEngine(config))

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer."""
        return self.engine.tokenizer

    # ---- loop thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._has_work:
                while not self._is_stopped and not self._has_pending_work():
                    self._has_work.wait()
                if self._is_stopped:
                    return
                try:
                    self._apply_pins()
                    outputs = self.engine.step()
                except Exception as exc:  # noqa: BLE001 (an engine bug must not hang every stream)
                    self._fail_all(exc)
                    continue
            for output in outputs:
                item = request_error(output.error_code, output.error) if output.error is not None else output
                self._deliver(output.request_id, item, is_last=output.is_finished)

    def _has_pending_work(self) -> bool:
        return self.engine.has_unfinished_requests() or self.engine.core.has_pending_deltas()

    def _deliver(self, request_id: str, item: RequestOutput | BaseException, is_last: bool) -> None:
        target = self._streams.pop(request_id, None) if is_last else self._streams.get(request_id)
        if target is not None:
            loop, queue = target
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def _fail_all(self, exc: BaseException) -> None:
        for request_id in list(self._streams):
            self.engine.abort(request_id)
            self._deliver(request_id, exc, is_last=True)

    # ---- public API ---------------------------------------------------------------------------------

    async def generate_stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Yield deltas for one request until it finishes; cancellation or early exit aborts it.

        The adapter may be host-only (registered, or `request.adapter_path` given): the engine loads it
        first, and the request waits in the engine's queue until its adapter fits.

        When the engine stops this request (other requests keep running) the stream raises the
        `errors.RequestFailedError` of its RequestOutput.error_code: NumericOverflowError (a ValueError)
        when its logits went non-finite, AdapterLoadFailedError when the planned copy of its adapter failed.
        """
        request_id = request.request_id
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        structured = request.sampling_params.structured_output
        if structured is not None:  # compiled off the loop and the step lock; add_request then hits the cache
            await asyncio.to_thread(self.engine.compile_constraint, structured)
        with self._has_work:
            self._apply_pins()
            self.engine.add_request(request)
            self._streams[request_id] = (asyncio.get_running_loop(), queue)
            self._has_work.notify()
        is_finished = False
        try:
            while not is_finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                is_finished = item.is_finished
                yield item
        finally:
            if not is_finished:
                self.abort_now(request_id)

    def abort_now(self, request_id: str) -> None:
        """Abort from any thread (blocks until the current step ends)."""
        with self._has_work:
            self._streams.pop(request_id, None)
            self.engine.abort(request_id)
            self._has_work.notify()

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with finish_reason "abort"."""
        await asyncio.to_thread(self._abort_keep_stream, request_id)

    def _abort_keep_stream(self, request_id: str) -> None:
        with self._has_work:
            self.engine.abort(request_id)
            self._has_work.notify()

    async def load_adapter(self, adapter_id: str, path: Path) -> None:
        """Put an adapter on the device now without blocking the event loop or the step loop;
        AdapterCapacityError when the adapters that would have to go are in use.

        The files are validated, read and packed off the engine lock (steps go on meanwhile); the pool's
        approval and the placement of the packed tensors happen under it, between steps."""
        info = await asyncio.to_thread(self.engine.inspect_adapter, path)
        started = time.perf_counter()
        packed = await asyncio.to_thread(
            self.engine.runner.transfers.load_adapter, adapter_id, Path(path), info
        )
        load = partial(
            self.engine.load_adapter,
            packed=packed,
            load_seconds=time.perf_counter() - started,
        )
        await asyncio.to_thread(self._locked, load, adapter_id, path, info)

    async def register_adapter(self, adapter_id: str, path: Path) -> None:
        """Make a verified host copy known to the engine without blocking the event loop (validated off the
        engine lock; nothing goes to the device: the core plans the copy when a request needs it)."""
        info = await asyncio.to_thread(self.engine.inspect_adapter, path)
        await asyncio.to_thread(self._locked, self.engine.register_adapter, adapter_id, path, info)

    def pin_adapter(self, adapter_id: str) -> None:
        """Lease an adapter (see LLMEngine.pin_adapter); never blocks: applied before the next engine call."""
        self._pending_pins.append((adapter_id, True))

    def unpin_adapter(self, adapter_id: str) -> None:
        """End a lease (applied before the next engine call)."""
        self._pending_pins.append((adapter_id, False))

    def _apply_pins(self) -> None:
        """Apply queued leases (call with the lock held)."""
        while self._pending_pins:
            adapter_id, is_pin = self._pending_pins.popleft()
            if not is_pin:
                self.engine.unpin_adapter(adapter_id)
            elif self.engine.residency.get(adapter_id) is not None:
                self.engine.pin_adapter(adapter_id)

    def adapter_residency(self, adapter_id: str) -> str:
        """ "none", "host", "preparing", "copying" or "device" (a snapshot read without waiting for the
        current step)."""
        return self.engine.adapter_residency(adapter_id)

    def device_adapters(self) -> list[str]:
        """Adapters on the device, least recently used first."""
        return self._locked(self.engine.device_adapters)

    async def unload_adapter(self, adapter_id: str) -> None:
        """Unload an adapter (AdapterInUseError while requests use it)."""
        await asyncio.to_thread(self._locked, self.engine.unload_adapter, adapter_id)

    def _locked(self, fn: Any, *args: Any) -> Any:
        with self._lock:
            self._apply_pins()
            return fn(*args)

    def loaded_adapters(self) -> list[str]:
        """Ids of the loaded adapters."""
        return self._locked(self.engine.loaded_adapters)

    def engine_stats(self) -> EngineStats:
        """Engine stats, typed."""
        stats: EngineStats = self._locked(self.engine.engine_stats)
        return stats

    def shutdown(self) -> None:
        """Stop the loop thread (pending requests are left as they are)."""
        with self._has_work:
            self._is_stopped = True
            self._has_work.notify()
        self._thread.join(timeout=10)
