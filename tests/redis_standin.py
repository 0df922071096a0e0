"""A Redis stand-in for tests of the Redis clients: a local server that reads commands as they come, counts them,
and answers each (0 to a script, OK otherwise), in order, only once `release` is set, or never, or drops the
connection after a given number of commands."""

from __future__ import annotations

import asyncio
from typing import Self


class HeldRedis:
    """The stand-in: `release` lets it answer; `num_connections` and `num_commands` count what it received and
    `commands` keeps each command (its arguments); `close_after` drops a connection after that many commands."""

    def __init__(self, *, close_after: int | None = None) -> None:
        self.num_connections = 0
        self.num_commands = 0
        self.commands: list[list[bytes]] = []
        self.release = asyncio.Event()
        self.close_after = close_after
        self._received = asyncio.Condition()
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def wait_for_commands(self, num_commands: int) -> None:
        """Until at least that many commands have been received, over every connection."""
        async with self._received:
            await self._received.wait_for(lambda: self.num_commands >= num_commands)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        answers: asyncio.Queue[bytes | None] = asyncio.Queue()
        answering = asyncio.ensure_future(self._answer(answers, writer))
        num_here = 0
        try:
            while (command := await read_resp_command(reader)) is not None:
                async with self._received:
                    self.num_commands += 1
                    self.commands.append(command)
                    self._received.notify_all()
                num_here += 1
                if self.close_after is not None and num_here >= self.close_after:
                    break
                answers.put_nowait(b":0\r\n" if command[0].upper() in (b"EVAL", b"EVALSHA") else b"+OK\r\n")
        finally:
            answering.cancel()
            writer.close()

    async def _answer(self, answers: asyncio.Queue[bytes | None], writer: asyncio.StreamWriter) -> None:
        await self.release.wait()
        while (answer := await answers.get()) is not None:
            writer.write(answer)
            await writer.drain()


async def read_resp_command(reader: asyncio.StreamReader) -> list[bytes] | None:
    """One command of the Redis protocol (an array of bulk strings), or None at the end of the stream."""
    header = await reader.readline()
    if not header:
        return None
    parts = []
    for _ in range(int(header[1:])):
        size = int((await reader.readline())[1:])
        parts.append((await reader.readexactly(size + 2))[:-2])
    return parts
