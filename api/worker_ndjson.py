"""Reading a worker's HTTP generate response (cluster.protocol): the NDJSON event lines of a 200 body and the
JSON error body of a refusal."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

import anyio
import httpx

from api.http1_transport import NEXT_CHUNK_EXTENSION
from cluster.protocol import GenerateEvent

DRAIN_TIMEOUT_S = 1.0  # reading what follows a terminal event (normally just the end of the body)

ChunkReader = Callable[[], Awaitable[bytes | None]]


def chunk_reader(response: httpx.Response) -> ChunkReader:
    """The body's next chunk, None at its end: the transport's own reader when it offers one (one coroutine per
    chunk instead of httpx's four nested async generators, which every waiting stream holds between two tokens),
    else httpx's aiter_bytes (another transport, or an encoded body)."""
    reader = response.extensions.get(NEXT_CHUNK_EXTENSION)
    if reader is not None and "content-encoding" not in response.headers:
        return cast(ChunkReader, reader)
    chunks = response.aiter_bytes()

    async def next_chunk() -> bytes | None:
        try:
            return await anext(chunks)
        except StopAsyncIteration:
            return None

    return next_chunk


@dataclass
class HttpEventSource:
    """The NDJSON body of a worker's HTTP generate response, an event per line (blank lines skipped), each line
    parsed as soon as it is complete."""

    response: httpx.Response
    read_chunk: ChunkReader
    _lines: deque[bytes] = field(default_factory=deque)
    _rest: bytes = b""  # the start of a line whose end has not arrived
    _is_eof: bool = False

    @classmethod
    def of(cls, response: httpx.Response) -> HttpEventSource:
        """The event source of a 200 response's body."""
        return cls(response, chunk_reader(response))

    async def next_event(self) -> GenerateEvent | None:
        """The next event; None at the end of the body."""
        while True:
            while self._lines:
                line = self._lines.popleft()
                if line.strip():
                    return GenerateEvent.model_validate_json(line)
            if self._is_eof:
                return None
            chunk = await self.read_chunk()
            if chunk is None:
                self._is_eof = True
                if self._rest:
                    self._lines.append(self._rest)
                    self._rest = b""
            elif b"\n" not in chunk:
                self._rest += chunk
            else:
                *lines, self._rest = (self._rest + chunk if self._rest else chunk).split(b"\n")
                self._lines.extend(lines)

    async def aclose(self, has_ended: bool) -> None:
        """Close the HTTP stream.

        After the terminal event the rest of the body (the end of the chunked encoding) is read first, so
        httpx returns the connection to its keep-alive pool instead of closing it: the next request then
        skips a TCP connect and the worker's connection setup. Mid-stream, closing aborts the request.
        """
        try:
            if has_ended:
                with anyio.move_on_after(DRAIN_TIMEOUT_S):
                    while not self._is_eof and await self.read_chunk() is not None:
                        pass
        except httpx.HTTPError:
            pass
        finally:
            await self.response.aclose()


def error_fields(body: str, status_code: int) -> tuple[str, str]:
    """(code, message) of a worker's JSON error body `{"error": {"type", "message"}}`."""
    try:
        error = json.loads(body)["error"]
        return str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return f"http_{status_code}", body[:300]
