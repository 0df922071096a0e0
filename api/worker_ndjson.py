"""Reading a worker's HTTP generate response (cluster.protocol): the NDJSON event lines of a 200 body and the
JSON error body of a refusal."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import httpx

from cluster.protocol import GenerateEvent

DRAIN_TIMEOUT_S = 1.0  # reading what follows a terminal event (normally just the end of the body)


@dataclass
class HttpEventSource:
    """The NDJSON body of a worker's HTTP generate response."""

    response: httpx.Response
    lines: AsyncIterator[bytes]

    async def next_event(self) -> GenerateEvent | None:
        """The next event; None at the end of the body."""
        return await next_event(self.lines)

    async def aclose(self, has_ended: bool) -> None:
        """Close the HTTP stream.

        After the terminal event the rest of the body (the end of the chunked encoding) is read first, so
        httpx returns the connection to its keep-alive pool instead of closing it: the next request then
        skips a TCP connect and the worker's connection setup. Mid-stream, closing aborts the request.
        """
        try:
            if has_ended:
                with anyio.move_on_after(DRAIN_TIMEOUT_S):
                    async for _ in self.lines:
                        pass
        except httpx.HTTPError:
            pass
        finally:
            await self.response.aclose()


async def next_event(lines: AsyncIterator[bytes]) -> GenerateEvent | None:
    """The next NDJSON event, skipping blank lines; None at the end of the stream."""
    async for line in lines:
        if line.strip():
            return GenerateEvent.model_validate_json(line)
    return None


async def ndjson_lines(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body's lines as bytes, split as the chunks arrive (a line is yielded as soon as it is complete).

    Cheaper than `aiter_lines` (no text decoding and line-decoder layers): the JSON parser reads bytes.
    """
    rest = b""
    async for chunk in response.aiter_bytes():
        if b"\n" not in chunk:
            rest += chunk
            continue
        *lines, tail = (rest + chunk if rest else chunk).split(b"\n")
        rest = tail
        for line in lines:
            yield line
    if rest:
        yield rest


def error_fields(body: str, status_code: int) -> tuple[str, str]:
    """(code, message) of a worker's JSON error body `{"error": {"type", "message"}}`."""
    try:
        error = json.loads(body)["error"]
        return str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return f"http_{status_code}", body[:300]
