"""TtlCache.load, the inference path's read-through of its caches (api/caches.py): one load for concurrent misses,
a reload ahead of expiry in the background, never a value past its TTL, never an entry brought back."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from sqlalchemy.exc import OperationalError

from api.caches import REFRESH_AHEAD_FRACTION, TtlCache
from tests.api.test_inference_caches import FakeClock

TTL_S = 4.0


class Source:
    """A loader whose answers the test sets and counts; `gate` holds each load until set."""

    def __init__(self, value: str | None) -> None:
        self.value = value
        self.error: Exception | None = None
        self.num_loads = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> str | None:
        self.num_loads += 1
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.value


async def _settle() -> None:
    """Let the loads started so far run to their end (they only wait on the gate)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_concurrent_misses_share_one_load_and_a_hit_reads_nothing() -> None:
    async def reads() -> tuple[list[str | None], int]:
        cache: TtlCache[str, str] = TtlCache(TTL_S, clock=FakeClock())
        source = Source("v1")
        source.gate.clear()
        waiting = [asyncio.ensure_future(cache.load("k", source)) for _ in range(5)]
        await _settle()
        source.gate.set()
        values = list(await asyncio.gather(*waiting))
        values.append(await cache.load("k", source))  # a hit
        return values, source.num_loads

    assert anyio.run(reads) == (["v1"] * 6, 1)


def test_an_entry_used_near_its_expiry_is_reloaded_in_the_background_and_never_served_past_its_ttl() -> None:
    async def reads() -> None:
        clock = FakeClock()
        cache: TtlCache[str, str] = TtlCache(TTL_S, clock=clock)
        source = Source("v1")
        assert await cache.load("k", source) == "v1"
        clock.now += TTL_S * (1 - REFRESH_AHEAD_FRACTION) - 0.01  # not yet in the last quarter
        assert await cache.load("k", source) == "v1" and source.num_loads == 1
        clock.now += 0.02
        source.value = "v2"
        source.gate.clear()
        assert await cache.load("k", source) == "v1"  # served at once; the reload runs meanwhile
        await asyncio.sleep(0)  # the reload starts (and waits on the gate)
        assert await cache.load("k", source) == "v1" and source.num_loads == 2  # one reload in flight
        source.gate.set()
        await _settle()
        clock.now += TTL_S * REFRESH_AHEAD_FRACTION  # the old entry's TTL is over; the reloaded one lives on
        assert await cache.load("k", source) == "v2" and source.num_loads == 2
        clock.now += TTL_S  # unused for a whole TTL: expired, loaded in the foreground
        source.value = "v3"
        assert await cache.load("k", source) == "v3" and source.num_loads == 3

    anyio.run(reads)


@pytest.mark.parametrize(
    ("answer", "is_kept"),
    [
        (None, False),  # revoked or gone: dropped
        (LookupError("a failure"), False),  # dropped: the next request loads in the foreground
        (OperationalError("SELECT 1", {}, Exception("the database is down")), True),  # serves on to its TTL
    ],
    ids=["gone", "failure", "outage"],
)
def test_a_reload_that_finds_nothing_or_fails_drops_the_entry_except_on_an_outage(
    answer: Exception | None, is_kept: bool
) -> None:
    async def reads() -> str | None:
        clock = FakeClock()
        cache: TtlCache[str, str] = TtlCache(TTL_S, clock=clock)
        source = Source("v1")
        assert await cache.load("k", source) == "v1"
        clock.now += TTL_S * (1 - REFRESH_AHEAD_FRACTION / 2)
        source.value = None
        source.error = answer if isinstance(answer, Exception) else None
        assert await cache.load("k", source) == "v1"  # the reload starts
        await _settle()
        return cache.get("k")

    assert anyio.run(reads) == ("v1" if is_kept else None)


def test_a_reload_never_brings_back_an_entry_dropped_meanwhile() -> None:
    async def reads() -> tuple[str | None, str | None]:
        clock = FakeClock()
        cache: TtlCache[str, str] = TtlCache(TTL_S, clock=clock)
        source = Source("v1")
        assert await cache.load("k", source) == "v1"
        clock.now += TTL_S * (1 - REFRESH_AHEAD_FRACTION / 2)
        source.gate.clear()
        assert await cache.load("k", source) == "v1"  # the reload reads the old answer...
        cache.discard_if(lambda key, _: key == "k")  # ...as the key is revoked through this process
        source.gate.set()
        await _settle()
        dropped = cache.get("k")
        cache.put("k", "v9")  # a later foreground load
        return dropped, cache.get("k")

    assert anyio.run(reads) == (None, "v9")
