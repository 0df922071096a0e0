"""The worker streams of one request's choices, read as one stream of (choice index, event).

One request's n choices run as n worker streams on one worker (api/inference/choices.py). The response reads
them merged, in arrival order, each event tagged with its choice's index; closing `ChoiceStreams` closes every
stream, which aborts each engine request still running, so a client that disconnects stops all n. With one
choice the merge is a plain pass-through of its stream (no task per event).

Invariant: after `aclose()` no read of any stream is pending (the merge's reads are cancelled and awaited
before the streams are closed), so nothing reads a stream that is being closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from api.worker_client import WorkerStream
from cluster.protocol import GenerateEvent

ChoiceEvent = tuple[int, GenerateEvent]


@dataclass
class ChoiceStreams:
    """The open worker streams of a request's choices (index i: choice i), all on one worker."""

    streams: list[WorkerStream]
    _merged: AsyncGenerator[ChoiceEvent, None] | None = field(default=None, repr=False)

    @property
    def worker_id(self) -> str:
        """The worker serving every choice."""
        return self.streams[0].worker_id

    @property
    def num_choices(self) -> int:
        """How many choices (streams)."""
        return len(self.streams)

    def events(self) -> AsyncIterator[ChoiceEvent]:
        """Every stream's events tagged with the choice index, in arrival order; each stream ends with its
        `final` or `error` event (WorkerStream.events)."""
        self._merged = _single(self.streams[0]) if len(self.streams) == 1 else _merge(self.streams)
        return self._merged

    async def aclose(self) -> None:
        """Stop reading and close every stream (aborts the engine requests still running). Idempotent."""
        merged, self._merged = self._merged, None
        try:
            if merged is not None:
                await merged.aclose()
        finally:
            for stream in self.streams:
                await stream.aclose()


async def _single(stream: WorkerStream) -> AsyncGenerator[ChoiceEvent, None]:
    async for event in stream.events():
        yield 0, event


async def _merge(streams: list[WorkerStream]) -> AsyncGenerator[ChoiceEvent, None]:
    iterators = [stream.events() for stream in streams]
    pending = {asyncio.ensure_future(anext(it)): index for index, it in enumerate(iterators)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):  # the lower index first: a stable order
                index = pending.pop(task)
                try:
                    event = task.result()
                except StopAsyncIteration:
                    continue
                yield index, event
                if event.type == "delta":
                    pending[asyncio.ensure_future(anext(iterators[index]))] = index
    finally:
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(BaseException):
                await task
        for it in iterators:
            with contextlib.suppress(BaseException):
                await it.aclose()  # type: ignore[attr-defined]
