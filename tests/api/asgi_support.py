"""Drive the ASGI app directly (no tests here): body chunks the test controls, a client that disconnects.

TestClient hands the app the whole body at once and never disconnects early; these helpers let a test
count how much of a body the app read and make the client leave while the response is being produced.
Run `drive` on the TestClient's own event loop (`client.portal.call(...)`), where the app's services live.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi.testclient import TestClient


@dataclass
class Exchange:
    """What the app sent back, and how many body chunks it asked for."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    num_chunks_read: int = 0

    @property
    def status(self) -> int | None:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    def json(self) -> Any:
        return json.loads(self.body)


def _scope(client: TestClient, path: str, headers: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "state": dict(getattr(client, "app_state", {})),
    }


async def drive(
    client: TestClient,
    path: str,
    headers: dict[str, str],
    chunks: Iterable[bytes],
    leave: Callable[[], Awaitable[None]] | None = None,
    on_message: Callable[[dict[str, Any]], None] | None = None,
) -> Exchange:
    """POST `chunks` (one per receive()) to the app; after the body the client waits for `leave()` and then
    disconnects (or, without `leave`, stays until the response is complete, as a normal client does).
    `on_message` sees each message the app sends as it arrives."""
    exchange = Exchange()
    response_done = anyio.Event()
    body = iter(chunks)
    pending = next(body, None)

    async def receive() -> dict[str, Any]:
        nonlocal pending
        if pending is not None:
            chunk, pending = pending, next(body, None)
            exchange.num_chunks_read += 1
            return {"type": "http.request", "body": chunk, "more_body": pending is not None}
        await (leave() if leave is not None else response_done.wait())
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        exchange.messages.append(message)
        if on_message is not None:
            on_message(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            response_done.set()

    await client.app(_scope(client, path, headers), receive, send)  # type: ignore[arg-type]
    return exchange


def run(client: TestClient, *args: Any, **kwargs: Any) -> Exchange:
    """`drive` on the TestClient's event loop."""
    return client.portal.call(lambda: drive(client, *args, **kwargs))  # type: ignore[union-attr]
