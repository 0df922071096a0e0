"""Reading a worker's NDJSON generate body (api/worker_ndjson.py): events parsed line by line as chunks arrive,
whatever the chunk boundaries, through the API's own transport's chunk reader or httpx's."""

from __future__ import annotations

import asyncio
import itertools
import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.http1_transport import NEXT_CHUNK_EXTENSION, Http1Transport
from api.worker_ndjson import HttpEventSource, chunk_reader
from tests.api.test_http1_transport import chunk, serving

EVENTS = [
    {"type": "delta", "text": "a", "token_ids": [1]},
    {"type": "delta", "text": "b\u00e9", "token_ids": [2, 3]},
    {"type": "final", "finish_reason": "length", "num_output_tokens": 3},
]
BODY = b"\n".join(json.dumps(e).encode() for e in EVENTS) + b"\n\n"  # a blank (keep-alive) line at the end


async def _read_all(source: HttpEventSource) -> list[tuple[str, str]]:
    events = []
    while (event := await source.next_event()) is not None:
        events.append((event.type, event.text))
    return events


def _source_of(chunks: list[bytes]) -> HttpEventSource:
    parts = iter(chunks)

    async def read_chunk() -> bytes | None:
        return next(parts, None)

    return HttpEventSource(httpx.Response(200), read_chunk)


@given(st.lists(st.integers(min_value=1, max_value=len(BODY) - 1), max_size=12, unique=True))
def test_every_event_is_read_whatever_the_chunk_boundaries(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(BODY)]
    chunks = [BODY[a:b] for a, b in itertools.pairwise(bounds)]
    events = asyncio.run(_read_all(_source_of(chunks)))
    assert events == [(e["type"], e.get("text", "")) for e in EVENTS]


def test_a_last_line_without_its_newline_is_still_an_event() -> None:
    events = asyncio.run(_read_all(_source_of([json.dumps(EVENTS[-1]).encode()])))
    assert events == [("final", "")]


@pytest.mark.anyio
async def test_the_api_s_transport_offers_its_own_chunk_reader_and_httpx_s_is_the_fallback() -> None:
    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: object) -> None:
        await server.read_request(reader)  # type: ignore[attr-defined]
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(chunk(BODY[:10]) + chunk(BODY[10:]) + b"0\r\n\r\n")

    for transport in (Http1Transport(), httpx.AsyncHTTPTransport()):
        async with serving(stream) as server, httpx.AsyncClient(transport=transport) as client:
            request = client.build_request("POST", server.url, content=b"{}")
            response = await client.send(request, stream=True)
            is_own = isinstance(transport, Http1Transport)
            assert (NEXT_CHUNK_EXTENSION in response.extensions) is is_own
            assert (chunk_reader(response) is response.extensions.get(NEXT_CHUNK_EXTENSION)) is is_own
            source = HttpEventSource.of(response)
            assert [t for t, _ in await _read_all(source)] == ["delta", "delta", "final"]
            await source.aclose(has_ended=True)
            assert response.is_closed
