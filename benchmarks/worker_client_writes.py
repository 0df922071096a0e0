"""The API's transport to workers: WorkerClient over api/http1_transport.py (asyncio protocols, httptools, each
request in one write) vs httpx's default transport (httpcore + h11, headers and body sent separately),
against a stub worker in its own process.

The stub is a Starlette app under uvicorn (the worker's server stack) answering POST
/internal/v1/generate with --num-deltas NDJSON delta events and a final event. Per round and variant:
--num-requests sequential requests (open -> first event -> read to the end -> aclose; p50/p99 of the first
event and of the whole request; CPU time per request of this process and of the stub, which load on a
shared machine moves less than latency), then --concurrency clients sending --num-requests requests together
(requests/s). Rounds alternate the variants, so drift on a shared machine hits both alike.

    /work/main/.venv/bin/python benchmarks/worker_client_writes.py --rounds 6

One JSON line per variant and round, then one summary line (medians over rounds, http1 / plain ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))

from cluster.membership import WorkerRecord
from cluster.protocol import GenerateRequest

STUB = """
import json, sys
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route
import uvicorn

NUM_DELTAS = int(sys.argv[2])

async def generate(request):
    body = json.loads(await request.body())
    async def lines():
        for i in range(NUM_DELTAS):
            yield json.dumps({"type": "delta", "text": "x", "token_ids": [i]}).encode() + b"\\n"
        yield json.dumps({"type": "final", "finish_reason": "length", "num_output_tokens": NUM_DELTAS,
                          "num_prompt_tokens": len(body.get("prompt") or "")}).encode() + b"\\n"
    return StreamingResponse(lines(), media_type="application/x-ndjson")

app = Starlette(routes=[Route("/internal/v1/generate", generate, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(port: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"stub worker did not listen on {port} within {deadline_s} s")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _one(client: Any, worker: WorkerRecord, index: int) -> tuple[float, float]:
    start = time.perf_counter()
    stream = await client.open(worker, GenerateRequest(request_id=f"r{index}", prompt="hello " * 20))
    first_s = time.perf_counter() - start
    async for _ in stream.events():
        pass
    await stream.aclose()
    return first_s, time.perf_counter() - start


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(
    make_client: Callable[[], Any], worker: WorkerRecord, stub_pid: int, args: argparse.Namespace
) -> dict[str, Any]:
    client = make_client()
    try:
        for index in range(20):  # warm-up: connections in the pool, code paths imported
            await _one(client, worker, index)
        cpu_before = (_cpu_s(os.getpid()), _cpu_s(stub_pid))
        timings = [await _one(client, worker, index) for index in range(args.num_requests)]
        cpu_after = (_cpu_s(os.getpid()), _cpu_s(stub_pid))
        start = time.perf_counter()
        queue = list(range(args.num_requests))

        async def run_client() -> None:
            while queue:
                await _one(client, worker, queue.pop())

        await asyncio.gather(*(run_client() for _ in range(args.concurrency)))
        concurrent_s = time.perf_counter() - start
    finally:
        await client.aclose()
    first = [t[0] * 1e3 for t in timings]
    whole = [t[1] * 1e3 for t in timings]
    return {
        "first_event_ms_p50": _percentile(first, 0.5),
        "first_event_ms_p99": _percentile(first, 0.99),
        "request_ms_p50": _percentile(whole, 0.5),
        "request_ms_p99": _percentile(whole, 0.99),
        "concurrent_requests_per_s": args.num_requests / concurrent_s,
        "client_cpu_us_per_request": (cpu_after[0] - cpu_before[0]) * 1e6 / args.num_requests,
        "worker_cpu_us_per_request": (cpu_after[1] - cpu_before[1]) * 1e6 / args.num_requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--num-requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--num-deltas", type=int, default=8)
    args = parser.parse_args()

    from api.http1_transport import Http1Transport
    from api.worker_client import WorkerClient

    variants: dict[str, Callable[[], Any]] = {
        "plain": lambda: WorkerClient.create("token", transport=httpx.AsyncHTTPTransport()),
        "http1": lambda: WorkerClient.create("token", transport=Http1Transport()),
    }
    port = _free_port()
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(port), str(args.num_deltas)])
    try:
        _wait_for(port, 30.0)
        worker = WorkerRecord("stub", f"http://127.0.0.1:{port}", "base", max_num_seqs=64, is_ready=True)
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for round_index in range(args.rounds):
            for name, make_client in variants.items():
                result = asyncio.run(_measure(make_client, worker, stub.pid, args))
                results[name].append(result)
                print(json.dumps({"system": name, "round": round_index, **result}), flush=True)
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    summary = {
        name: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for name, rows in results.items()
    }
    summary["http1_over_plain"] = {
        key: summary["http1"][key] / summary["plain"][key] for key in summary["plain"]
    }
    print(json.dumps({"system": "summary", **summary}), flush=True)


if __name__ == "__main__":
    main()
