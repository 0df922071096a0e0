"""Cancel work when the HTTP client goes away: for responses built in full before they are sent.

A streamed response notices a disconnect when it writes; a non-streamed one writes nothing until the work is
done, so without this it would run (and generate tokens nobody reads) to the end. Watch the ASGI receive
channel instead: once the request body has been read, the next message is `http.disconnect`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.types import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client disconnected before the work finished (the work was cancelled)."""


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # more body (none is expected once the body was read): ignore
    scope.cancel()


async def run_until_disconnect(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    """`await work()`, cancelled as soon as the client disconnects (then ClientDisconnected is raised).

    Call it after the request body was read in full. The work's own finalisers run on cancellation (shield
    them with anyio.CancelScope(shield=True) if they await). Exceptions of the work propagate unchanged.
    """
    outcome: dict[str, Any] = {}
    async with anyio.create_task_group() as group:
        group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
        try:
            outcome["result"] = await work()
        except Exception as exc:  # noqa: BLE001 - re-raised below, outside the task group (no ExceptionGroup)
            outcome["error"] = exc
        group.cancel_scope.cancel()
    if "error" in outcome:
        raise outcome["error"]
    if "result" not in outcome:
        raise ClientDisconnected("the client disconnected before the response was ready")
    return outcome["result"]
