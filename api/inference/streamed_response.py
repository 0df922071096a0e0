"""The HTTP side of a streamed response: an ASGI response that sends the chunks of a body generator as they come,
closes the generator whatever happens (its finaliser meters the request) and ends the body with its last chunk
(StreamEnd) in one write. What the chunks hold (SSE) is api/inference/respond.py's."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.disconnect import cancelled_on_disconnect


class MeteredStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its body generator, so its finaliser (abort the worker request,
    record the usage) runs even when the client disconnects while the generator waits at a `yield`.

    The headers and the first chunk (built from the worker's first event, already read) are sent before the
    disconnect listener starts: the first token does not wait for an event-loop turn (or, under GIL
    contention, for another thread's time slice). The body is then streamed from the request's own task in a
    cancel scope that a listener task cancels when the client disconnects: Starlette's task group (a second
    task group member: api/disconnect.py) cost ~165 us of CPU per response for the same effect.
    """

    is_started: bool = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["type"] != "http":
                await super().__call__(scope, receive, send)
                return
            await self._send_start(send)
            first = await anext(self.body_iterator, None)  # type: ignore[call-overload]
            if first is not None:
                await send(_body_message(first))
                if isinstance(first, StreamEnd):
                    return
            with cancelled_on_disconnect(receive):  # as anyio cancels: never inside a shielded scope
                await self.stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]

    async def _send_start(self, send: Send) -> None:
        if not self.is_started:
            self.is_started = True
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )

    async def stream_response(self, send: Send) -> None:
        await self._send_start(send)
        async for chunk in self.body_iterator:
            await send(_body_message(chunk))
            if isinstance(chunk, StreamEnd):
                return  # nothing follows: the generator, at its last yield, is closed by __call__
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class StreamEnd(bytes):
    """A streamed body's last chunk: sent with the end of the body (chunked encoding's terminator), one socket
    write instead of two; its generator yields nothing after it."""


def _body_message(chunk: str | bytes | memoryview) -> dict[str, Any]:
    """The ASGI message of a body chunk: the body's last (`more_body` False) when it is a StreamEnd."""
    body = chunk.encode() if isinstance(chunk, str) else chunk
    return {"type": "http.response.body", "body": body, "more_body": not isinstance(chunk, StreamEnd)}
