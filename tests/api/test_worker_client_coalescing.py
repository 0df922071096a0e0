"""WorkerClient sends each request to a worker in one write (headers + body), not one per h11 event."""

from __future__ import annotations

from typing import Any

import httpcore
import pytest

from api.worker_client import WorkerClient, _CoalescingBackend, _CoalescingStream


class RecordingStream(httpcore.AsyncNetworkStream):
    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.log.append(("read", max_bytes))
        return b"reply"

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.log.append(("write", buffer))

    async def aclose(self) -> None:
        self.log.append(("close", None))

    def get_extra_info(self, info: str) -> Any:
        return f"info:{info}"


@pytest.mark.anyio
async def test_writes_are_joined_and_sent_before_the_next_read() -> None:
    inner = RecordingStream()
    stream = _CoalescingStream(inner)
    await stream.write(b"POST / HTTP/1.1\r\n\r\n")
    await stream.write(b"")
    await stream.write(b"{}")
    assert inner.log == []
    assert await stream.read(10) == b"reply"
    assert inner.log == [("write", b"POST / HTTP/1.1\r\n\r\n{}"), ("read", 10)]
    await stream.read(5)  # nothing pending: no empty write
    assert inner.log[-1] == ("read", 5) and len(inner.log) == 3
    assert stream.get_extra_info("is_readable") == "info:is_readable"
    await stream.write(b"abandoned")
    await stream.aclose()
    assert inner.log[-1] == ("close", None) and ("write", b"abandoned") not in inner.log


@pytest.mark.anyio
async def test_the_default_client_coalesces() -> None:
    client = WorkerClient.create("token")
    try:
        pool = client.http._transport._pool  # type: ignore[attr-defined]
        assert isinstance(pool._network_backend, _CoalescingBackend)
    finally:
        await client.aclose()
