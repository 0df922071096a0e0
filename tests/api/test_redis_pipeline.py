"""The pipelined Redis connection of the rate limiter's checks (api/redis_pipeline.py): answers parsed however
they are split, one write per turn of the loop, scripts by SHA1 with the source sent when Redis lacks them, the
connection's handshake, and every failure a redis-py exception the limiter handles."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import anyio
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from api.ratelimit import RateLimits
from api.redis_pipeline import PipelinedRedis, _RedisProtocol, encode_command
from api.redis_ratelimit import RedisRateLimiter
from lorahost.processes import free_port
from tests.redis_standin import HeldRedis
from tests.services import REDIS_URL, redis_with_prefix

replies = st.recursive(
    st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=40) | st.none(),
    lambda children: st.lists(children, max_size=4),
    max_leaves=12,
)


def _resp(reply: Any) -> bytes:
    """A reply as Redis writes it (RESP2)."""
    if reply is None:
        return b"$-1\r\n"
    if isinstance(reply, int):
        return b":%d\r\n" % reply
    if isinstance(reply, bytes):
        return b"$%d\r\n%b\r\n" % (len(reply), reply)
    return b"*%d\r\n" % len(reply) + b"".join(_resp(item) for item in reply)


@given(st.lists(replies, min_size=1, max_size=6), st.data())
def test_answers_split_anywhere_resolve_their_commands_in_order(
    answers: list[Any], data: st.DataObject
) -> None:
    loop = asyncio.new_event_loop()
    try:
        protocol = _RedisProtocol()
        futures = [loop.create_future() for _ in answers]
        protocol.pending.extend(futures)
        stream = b"".join(_resp(answer) for answer in answers)
        cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            protocol.data_received(stream[start:end])
        assert [future.result() for future in futures] == answers
        assert not protocol.pending
    finally:
        loop.close()


def test_error_answers_fail_their_own_command_only() -> None:
    loop = asyncio.new_event_loop()
    try:
        protocol = _RedisProtocol()
        futures = [loop.create_future() for _ in range(3)]
        protocol.pending.extend(futures)
        protocol.data_received(b":1\r\n-NOSCRIPT No matching script.\r\n-ERR wrong type\r\n")
        assert futures[0].result() == 1
        with pytest.raises(NoScriptError):
            futures[1].result()
        with pytest.raises(ResponseError, match="wrong type"):
            futures[2].result()
    finally:
        loop.close()


class _Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


def test_the_commands_of_one_turn_of_the_loop_leave_in_one_write() -> None:
    async def turn() -> list[bytes]:
        protocol = _RedisProtocol()
        transport = _Recording()
        protocol.connection_made(transport)
        for key in ("a", "b", "c"):
            protocol.send(encode_command(["GET", key]))
        assert transport.writes == []  # not before the loop's next turn
        await asyncio.sleep(0)
        protocol.send(encode_command(["GET", "d"]))
        await asyncio.sleep(0)
        return transport.writes

    assert anyio.run(turn) == [
        b"".join(encode_command(["GET", key]) for key in ("a", "b", "c")),
        encode_command(["GET", "d"]),
    ]


@pytest.mark.parametrize("use_uvloop", [False, True], ids=["asyncio", "uvloop"])  # uvicorn's loop: uvloop
def test_commands_and_scripts_against_redis_with_the_script_sent_when_redis_lacks_it(
    use_uvloop: bool,
) -> None:
    gen = redis_with_prefix()
    client, prefix = next(gen)
    source = (
        f"-- {uuid.uuid4().hex}\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])"  # a script Redis never saw
    )

    async def calls() -> list[Any]:
        pipelined = PipelinedRedis(REDIS_URL)
        script = pipelined.register_script(source)
        try:
            answers = [
                await script(keys=[f"{prefix}n"], args=[2]),  # NOSCRIPT, then sent whole
                await script(keys=[f"{prefix}n"], args=[3]),  # held by Redis now
                await pipelined.execute_command("SET", f"{prefix}s", b"a\r\nb"),
                await pipelined.execute_command("MGET", f"{prefix}s", f"{prefix}missing"),
                await pipelined.zrem(f"{prefix}z", "nobody"),
                pipelined.num_connects,
            ]
            with pytest.raises(ResponseError):
                await pipelined.execute_command(
                    "INCR", f"{prefix}s"
                )  # not an integer: this command alone fails
            answers.append(await pipelined.execute_command("GET", f"{prefix}n"))
            return answers
        finally:
            await pipelined.aclose()

    try:
        answers = anyio.run(calls, backend_options={"use_uvloop": use_uvloop})
        assert answers == [2, 5, b"OK", [b"a\r\nb", None], 0, 1, b"5"]
        assert client.script_exists(client.script_load(source)) == [True]
    finally:
        gen.close()


def test_a_new_connection_authenticates_selects_the_database_and_names_itself() -> None:
    async def handshake() -> list[list[bytes]]:
        async with HeldRedis() as server:
            server.release.set()
            pipelined = PipelinedRedis(
                f"redis://tenant-user:s3cret@127.0.0.1:{server.port}/2", client_name="lorahost-api"
            )
            assert await pipelined.execute_command("PING") == b"OK"
            await pipelined.aclose()
            return server.commands

    assert anyio.run(handshake) == [
        [b"AUTH", b"tenant-user", b"s3cret"],
        [b"SELECT", b"2"],
        [b"CLIENT", b"SETNAME", b"lorahost-api"],
        [b"PING"],
    ]


def test_a_lost_connection_fails_its_commands_and_the_next_command_reconnects() -> None:
    async def lost() -> tuple[int, int]:
        async with HeldRedis(close_after=2) as server:
            pipelined = PipelinedRedis(server.url, reconnect_interval_s=0)
            first = asyncio.ensure_future(pipelined.execute_command("PING"))
            second = asyncio.ensure_future(pipelined.execute_command("PING"))
            for command in (first, second):  # the server dropped the connection with both unanswered
                with pytest.raises(RedisConnectionError, match="lost"):
                    await command
            server.release.set()
            assert await pipelined.execute_command("PING") == b"OK"
            await pipelined.aclose()
            return pipelined.num_connects, server.num_connections

    assert anyio.run(lost) == (2, 2)


def test_an_unanswered_command_times_out_drops_the_connection_and_the_limiter_counts_in_process() -> None:
    async def unanswered() -> None:
        async with HeldRedis() as server:  # never released: never answers
            limiter = RedisRateLimiter(
                redis.Redis.from_url(server.url),  # the blocking client: unused here
                async_client_factory=lambda: PipelinedRedis(server.url, timeout_s=0.2),
            )
            with pytest.raises(RedisTimeoutError):
                await PipelinedRedis(server.url, timeout_s=0.2).execute_command("PING")
            decision = await limiter.acquire_async("t1", 0, RateLimits(max_requests_per_min=1))
            assert decision.is_allowed and limiter.is_degraded  # counted in this process
            assert not (await limiter.acquire_async("t1", 0, RateLimits(max_requests_per_min=1))).is_allowed
            await limiter.aclose()

    anyio.run(unanswered)


def test_an_unreachable_redis_fails_at_once_and_is_tried_again_after_the_interval() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"

    async def unreachable() -> None:
        waiting = PipelinedRedis(url, reconnect_interval_s=3600)
        with pytest.raises(RedisConnectionError, match="Error connecting") as first:
            await waiting.execute_command("PING")
        assert first.value.__cause__ is None  # not a wait for a turn (api/redis_ratelimit.py is_pool_wait)
        with pytest.raises(RedisConnectionError, match="retrying shortly"):  # no connect tried
            await waiting.execute_command("PING")
        retrying = PipelinedRedis(url, reconnect_interval_s=0)
        for _ in range(2):
            with pytest.raises(RedisConnectionError, match="Error connecting"):
                await retrying.execute_command("PING")

    anyio.run(unreachable)
