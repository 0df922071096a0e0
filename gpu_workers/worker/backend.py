"""The interface the worker service talks to; the native engine and (later) a vLLM backend implement it.

Backends are chosen by name (settings.worker.backend) in gpu_workers/worker/builder.py `BACKENDS`, the only place
that picks one: a new backend implements this protocol and adds one entry there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from gpu_workers.engine.outputs import RequestOutput
from scheduler.core.engine_request import EngineRequest
from scheduler.core.engine_stats import EngineStats


@runtime_checkable
class InferenceBackend(Protocol):
    """Async, thread-safe serving interface over one base model with many LoRA adapters."""

    def generate_stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Yield token deltas until the request finishes; cancelling the iteration aborts the request.

        The one request shape (scheduler/core/engine_request.py), built once by the worker's prepare.

        A request the engine stops raises an `errors.RequestFailedError` whose `code` says why
        ("adapter_unavailable": the adapter's planned copy failed; "numeric_overflow")."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request (no-op when unknown or already finished)."""
        ...

    async def load_adapter(self, adapter_id: str, path: Path) -> None:
        """Load or reload an adapter from a local PEFT directory onto the device now (the backend decides
        what to evict; AdapterCapacityError when the adapters that would have to go are in use). An explicit
        call (a prefetch); requests do not need it: they name a registered adapter and wait for room."""
        ...

    async def register_adapter(self, adapter_id: str, path: Path) -> None:
        """Make a verified host copy known, validated, without touching the device (requests may then name
        the adapter; the backend copies it to the device when their turn comes). AdapterLoadError (a
        ValueError) when the files are invalid for this engine."""
        ...

    def pin_adapter(self, adapter_id: str) -> None:
        """Lease an adapter so idle-adapter eviction skips it."""
        ...

    def unpin_adapter(self, adapter_id: str) -> None:
        """End a lease."""
        ...

    def adapter_residency(self, adapter_id: str) -> str:
        """ "none", "host", "preparing", "copying" or "device"."""
        ...

    def device_adapters(self) -> list[str]:
        """Adapters on the device, least recently used first."""
        ...

    async def unload_adapter(self, adapter_id: str) -> None:
        """Drop an adapter (AdapterInUseError while requests use it)."""
        ...

    def loaded_adapters(self) -> list[str]:
        """Ids of the loaded adapters."""
        ...

    def engine_stats(self) -> EngineStats:
        """Engine state, counters and timings, typed (scheduler/core/engine_stats.py)."""
        ...

    def shutdown(self) -> None:
        """Stop background work."""
        ...
