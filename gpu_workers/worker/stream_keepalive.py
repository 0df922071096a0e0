"""A generate stream's keepalive: blank NDJSON lines while a request waits for its first event.

The API reads a worker's stream with a read timeout (settings.api.worker_read_timeout_s) so that a link that went
silent (a partition, a host that vanished without a reset) ends its streams instead of holding them for minutes.
A request may legitimately wait longer than that for its first token (queued behind others, its adapter loading,
a long prefill), so until its first event the worker sends a blank line every `interval_s`; readers of the
protocol skip blank lines (api/worker_ndjson.py `next_event`), so an API that predates this reads the stream as
before. After the first event the lines pass straight through: tokens then come every step, and a watch per
token would cost ~15 us of the event loop each (a task and a wait), for silences that do not happen there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

KEEPALIVE_LINE = b"\n"


async def with_keepalive(lines: AsyncIterator[bytes], interval_s: float) -> AsyncIterator[bytes]:
    """`lines` as they come, with KEEPALIVE_LINE after every `interval_s` before the first one (0: none added).

    Closing this iterator (the client went away) cancels the pending read of `lines` and closes it, as closing
    `lines` itself would.
    """
    if interval_s <= 0:
        async for line in lines:
            yield line
        return
    iterator = aiter(lines)
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait((pending,), timeout=interval_s)
            if not done:
                yield KEEPALIVE_LINE
                continue
            try:
                line = pending.result()
            except StopAsyncIteration:
                pending = None
                return
            pending = None
            yield line
            break
        async for line in iterator:  # the first event is out: the rest as they come
            yield line
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()
