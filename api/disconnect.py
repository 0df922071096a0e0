"""Cancel work when the HTTP client goes away: a response built in full before it is sent, a stream waiting
between two chunks, a request waiting for a worker.

Sending to a client that left does not fail (uvicorn drops the bytes), and a non-streamed response writes
nothing until the work is done, so without this the work would run (and generate tokens nobody reads) to the
end. Watch the ASGI receive channel instead: once the request body has been read, the next message is
`http.disconnect`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio
from starlette.types import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client disconnected before the work finished (the work was cancelled)."""


async def cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel `scope` once the ASGI receive channel says the client disconnected."""
    while (await receive())["type"] != "http.disconnect":
        pass  # more body (none is expected once the body was read): ignore
    scope.cancel()


@contextmanager
def cancelled_on_disconnect(receive: Receive) -> Iterator[anyio.CancelScope]:
    """A cancel scope cancelled (as anyio cancels: not inside shielded scopes) once the client disconnects.

    The listener is a plain task of the event loop, not a task group member: a task group (its member
    bookkeeping, exception groups and cancellation delivery) cost ~165 us of CPU per request for the same
    effect (benchmarks/RESULTS.md, Chaos & scale, eighteenth pass). Call it after the request body was read.
    """
    with anyio.CancelScope() as scope:
        listener = asyncio.get_running_loop().create_task(cancel_on_disconnect(receive, scope))
        try:
            yield scope
        finally:
            listener.cancel()


async def run_until_disconnect(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    """`await work()`, cancelled as soon as the client disconnects (then ClientDisconnected is raised).

    Call it after the request body was read in full. The work's own finalisers run on cancellation (shield
    them with anyio.CancelScope(shield=True) if they await). Exceptions of the work propagate unchanged.
    """
    with cancelled_on_disconnect(receive):
        return await work()
    raise ClientDisconnected("the client disconnected before the response was ready")
