"""The worker streams of one request's choices, read as one stream of (choice index, event).

One request's n choices run as n worker streams on one worker (api/inference/choices.py). The response reads
them merged, in arrival order, each event tagged with its choice's index; closing `ChoiceStreams` closes every
stream, which aborts each engine request still running, so a client that disconnects stops all n. With one
choice the merge is a plain pass-through of its stream (no task per event).

Choices may also be handed over still to open (`openers`: a streamed response starts with choice 0 alone,
api/inference/route.py): the merge opens them when it starts reading, beside choice 0's events, and a choice
that cannot start (the worker refuses it, or is unavailable) reads as that choice's `error` event, as a worker
failing mid-stream does.

Invariants: after `aclose()` no read of any stream is pending and no choice is still being opened (the merge's
reads and openings are cancelled and awaited before the streams are closed; a cancelled opening closes what it
had opened: api/worker_client.py), so nothing reads a stream that is being closed and no worker stream leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from api.worker_client import WorkerStream, WorkerUnavailableError
from cluster.protocol import GenerateEvent

ChoiceEvent = tuple[int, GenerateEvent]
# Opens one choice's worker stream (its first event read); WorkerUnavailableError when it cannot start.
StreamOpener = Callable[[], Awaitable[WorkerStream]]


@dataclass
class ChoiceStreams:
    """The worker streams of a request's choices, all on one worker: `streams` open (index i: choice i), then
    `openers` for choices len(streams).. , opened once `events()` is read."""

    streams: list[WorkerStream]
    openers: list[StreamOpener] = field(default_factory=list)
    _opened: list[WorkerStream] = field(default_factory=list, repr=False)  # by `openers`, to be closed
    _merged: AsyncGenerator[ChoiceEvent, None] | None = field(default=None, repr=False)

    @property
    def worker_id(self) -> str:
        """The worker serving every choice."""
        return self.streams[0].worker_id

    @property
    def num_choices(self) -> int:
        """How many choices (streams, open or to open)."""
        return len(self.streams) + len(self.openers)

    def events(self) -> AsyncIterator[ChoiceEvent]:
        """Every stream's events tagged with the choice index, in arrival order; each stream ends with its
        `final` or `error` event (WorkerStream.events; a choice that could not open: one `error` event)."""
        if self.num_choices == 1:
            self._merged = _single(self.streams[0])
        else:
            sources = [stream.events() for stream in self.streams]
            sources += [self._open_and_read(index, opener) for index, opener in self._numbered_openers()]
            self._merged = _merge(sources)
        return self._merged

    def _numbered_openers(self) -> list[tuple[int, StreamOpener]]:
        return [(len(self.streams) + i, opener) for i, opener in enumerate(self.openers)]

    async def _open_and_read(self, index: int, opener: StreamOpener) -> AsyncGenerator[GenerateEvent, None]:
        """Choice `index`'s events once it is open; one `error` event when it cannot start."""
        try:
            stream = await opener()
        except WorkerUnavailableError as exc:
            yield GenerateEvent(
                type="error", code="internal", message=f"choice {index} could not start: {exc}"
            )
            return
        self._opened.append(stream)  # no await since the open returned: a cancellation cannot lose it
        async for event in stream.events():
            yield event

    async def aclose(self) -> None:
        """Stop reading and opening, and close every stream (aborts the engine requests still running).
        Idempotent."""
        merged, self._merged = self._merged, None
        try:
            if merged is not None:
                await merged.aclose()
        finally:
            for stream in [*self.streams, *self._opened]:
                await stream.aclose()


async def _single(stream: WorkerStream) -> AsyncGenerator[ChoiceEvent, None]:
    async for event in stream.events():
        yield 0, event


async def _merge(sources: list[AsyncIterator[GenerateEvent]]) -> AsyncGenerator[ChoiceEvent, None]:
    pending = {asyncio.ensure_future(anext(it)): index for index, it in enumerate(sources)}
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
                    pending[asyncio.ensure_future(anext(sources[index]))] = index
    finally:
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(BaseException):
                await task
        for it in sources:
            with contextlib.suppress(BaseException):
                await it.aclose()  # type: ignore[attr-defined]
