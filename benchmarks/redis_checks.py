"""What the rate limiter's async checks cost the event loop, by Redis client (issue 38, item 4).

    python benchmarks/redis_checks.py [--num-sequential 4000] [--num-concurrent 2000] [--max-connections 32]

Three clients of the same Redis, each running `RedisRateLimiter.acquire_async` (one Lua script call):
- `unbounded`: redis.asyncio's own pool (a connection per concurrent command, every one kept);
- `blocking-pool`: redis' BlockingConnectionPool at --max-connections (the API's client in the eleventh and twelfth
  passes; the thirteenth to sixteenth passes' semaphore over redis' own pool cost the same per check);
- `pipelined`: the API's client (`api.redis_ratelimit.async_redis_client`: one pipelined connection, at most
  --max-connections commands in flight, api/redis_pipeline.py).
Printed per client: CPU microseconds per check run one after another (the loop's cost when nothing waits), and
for --num-concurrent checks started at once (several --bursts, a tail comes from waiting): each check's latency
p50 / p99 / max, the burst's wall time and the connections the client opened. Redis is the one at --redis-url (the
session's local server by default; the keys are removed after). Not a test: numbers depend on the machine
(its CPU is printed). The loop is uvloop when installed, as in the API.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run_info import cpu_model

from api.ratelimit import RateLimits
from api.redis_ratelimit import RedisRateLimiter, async_redis_client

LIMITS = RateLimits(max_requests_per_min=None, max_tokens_per_min=None)


def run_loop(main: Any) -> Any:
    """Run a coroutine on the event loop the API's uvicorn runs (uvloop when installed, as its `auto` picks)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def clients(url: str, max_connections: int, name: str) -> dict[str, Callable[[], Any]]:
    """Each client variant's factory, by variant; `name` names its connections (to count them)."""
    return {
        "unbounded": lambda: redis.asyncio.Redis.from_url(url, client_name=name),
        "blocking-pool": lambda: redis.asyncio.Redis.from_pool(
            redis.asyncio.BlockingConnectionPool.from_url(
                url, max_connections=max_connections, timeout=5.0, client_name=name
            )
        ),
        "pipelined": lambda: async_redis_client(url, max_connections, name),
    }


async def measure(limiter: RedisRateLimiter, args: argparse.Namespace) -> dict[str, float]:
    """CPU per sequential check, then the latency of each check in concurrent bursts."""
    tenant = uuid.uuid4().hex
    for _ in range(200):  # connect, load the script
        await limiter.acquire_async(tenant, 1, LIMITS)
    started = time.process_time()
    for _ in range(args.num_sequential):
        await limiter.acquire_async(tenant, 1, LIMITS)
    cpu_us = (time.process_time() - started) / args.num_sequential * 1e6

    async def timed() -> float:
        began = time.perf_counter()
        await limiter.acquire_async(tenant, 1, LIMITS)
        return time.perf_counter() - began

    latencies: list[float] = []
    walls: list[float] = []
    for _ in range(args.bursts):
        began = time.perf_counter()
        latencies += await asyncio.gather(*(timed() for _ in range(args.num_concurrent)))
        walls.append(time.perf_counter() - began)
    latencies.sort()
    return {
        "cpu_us_per_check": cpu_us,
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
        "max_ms": latencies[-1] * 1e3,
        "burst_wall_ms": statistics.median(walls) * 1e3,
    }


def run_variant(url: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """One client variant in a fresh event loop; adds the connections it opened (counted by the server)."""
    name = f"bench-{uuid.uuid4().hex[:12]}"
    sync = redis.Redis.from_url(url)
    prefix = f"lorahost:bench:{name}:"
    factory = clients(url, args.max_connections, name)[variant]
    limiter = RedisRateLimiter(sync, key_prefix=prefix, async_client_factory=factory)

    async def main() -> dict[str, Any]:
        result: dict[str, Any] = await measure(limiter, args)
        result["connections"] = sum(1 for conn in sync.client_list() if conn.get("name") == name)
        await limiter.aclose()
        return result

    try:
        return {"client": variant, **run_loop(main())}
    finally:
        for key in sync.scan_iter(f"{prefix}*"):
            sync.delete(key)
        sync.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-sequential", type=int, default=4000)
    p.add_argument("--num-concurrent", type=int, default=2000)
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--max-connections", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="each variant this often, interleaved")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = p.parse_args()
    print(f"CPU: {cpu_model()}")
    rows = [
        run_variant(args.redis_url, variant, args)
        for _ in range(args.repeats)
        for variant in ("unbounded", "blocking-pool", "pipelined")
    ]
    print(
        f"{'client':<14} {'cpu us/check':>12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'burst ms':>9} {'conns':>6}"
    )
    for row in rows:
        print(
            f"{row['client']:<14} {row['cpu_us_per_check']:>12.1f} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f}"
            f" {row['max_ms']:>8.1f} {row['burst_wall_ms']:>9.1f} {row['connections']:>6}"
        )


if __name__ == "__main__":
    main()
