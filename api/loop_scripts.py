"""Redis Lua scripts registered on a `redis.asyncio` client per event loop.

A `redis.asyncio` connection belongs to the event loop that opened it, and an API process may run more than one
loop over its life (its server's, a test client's): each loop gets its own client, built on first use there and
dropped with the loop.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any


class LoopScripts:
    """The scripts `sources`, registered on the client `make_client()` builds for the running loop."""

    def __init__(self, make_client: Callable[[], Any] | None, sources: Sequence[str]) -> None:
        self._make_client = make_client
        self._sources = tuple(sources)
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> list[Any] | None:
        """The running loop's scripts, in the order of `sources` (None without a client factory)."""
        if self._make_client is None:
            return None
        loop = asyncio.get_running_loop()
        scripts = self._by_loop.get(loop)
        if scripts is None:
            client = self._make_client()
            scripts = self._by_loop[loop] = [client.register_script(source) for source in self._sources]
        return scripts
