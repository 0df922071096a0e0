"""Many connections (issue 38 item 4): --num-streams concurrent streaming clients across 2 API replicas, some of
them slow readers, against a paced stub worker; the API's memory and its overhead on TTFT.

    python benchmarks/many_streams.py [--num-streams 2000] [--num-tokens 30] [--pace-s 1.0] [--out FILE]
        [--load-cpus 1] [--platform-cpus 0]

The stub worker (a Starlette app under uvicorn, the worker's server stack, in its own process) speaks the worker
protocol: POST /internal/v1/generate answers NDJSON, its first delta at once, then one delta every --pace-s, then
the final event. It is registered in the cluster's Redis directory as a ready worker with room for every stream,
so the API neither queues nor refuses for want of a worker. The cluster: `lorahost dev-cluster` with 2 API
replicas, no engine worker, PostgreSQL, Redis; a tenant on a plan whose limits the run stays under.

Phases, same clients, same stub, --ramp-s to open every stream:
- direct: the clients stream from the stub itself (what TTFT is on this machine at this concurrency with no API);
- platform: the same streams as SSE completions through the API replicas, half each.
Every --slow-every-th client is a slow reader (a 4 KiB receive buffer, --slow-read-s between reads): the API
must hold its stream with backpressure, not buffer it. Printed: TTFT p50/p99 per phase, the platform's overhead
(the difference), the API replicas' peak RSS and descriptors (sampled every 0.25 s with their children) and
their descriptors by kind once a phase's streams ended (benchmarks/fd_kinds.py), errors by kind, and per
platform phase the API's request stages, event loop lag and garbage collection pauses (from its /metrics), and
per phase the client's own event loop lag (a wake-up due every 1 ms: a late client reads a first token late). The
client (during a phase) and the stub do not collect garbage: their own full collections (95-300 ms at 2,000
streams) were in both phases' tails and are neither the platform's nor a worker's. Per phase also: the API
replicas' CPU in their main threads (the event loop) and in their other threads (the usage writer), and how often
their threads were preempted while runnable (involuntary context switches). Not a test: numbers depend on
the machine (its CPU is printed). On a host of few cores the client and the stub take cores the platform would
use: --load-cpus confines them (and --platform-cpus the API replicas, PostgreSQL and Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from fd_kinds import peer_ports, tree_fd_kinds
from model_dirs import ensure_model
from run_info import cpu_model, git_state

from cluster.membership import RedisWorkerDirectory, WorkerRecord
from lorahost.dev_cluster import DevCluster
from lorahost.dev_cluster_config import DevClusterConfig
from lorahost.processes import free_port

STUB = """
import asyncio, gc, json, sys
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
import uvicorn

PACE_S = float(sys.argv[2])
gc.disable()  # a stand-in's pauses (35-300 ms full collections at 2,000 streams) would be in both phases' tails

async def generate(request):
    body = json.loads(await request.body())
    num = int(body.get("sampling", {}).get("max_tokens", 16))
    async def lines():
        for i in range(num):
            if i:
                await asyncio.sleep(PACE_S)
            yield json.dumps({"type": "delta", "text": " x", "token_ids": [7]}).encode() + b"\\n"
        yield json.dumps({"type": "final", "finish_reason": "length", "num_output_tokens": num,
                          "num_prompt_tokens": 4}).encode() + b"\\n"
    return StreamingResponse(lines(), media_type="application/x-ndjson")

async def ok(request):
    return JSONResponse({"status": "ok"})

app = Starlette(routes=[Route("/internal/v1/generate", generate, methods=["POST"]),
                        Route("/internal/v1/ready", ok), Route("/internal/v1/health", ok)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", backlog=4096)
"""
SLOW_RCVBUF = 4096
WORKER_ID = "stub-worker"


@dataclass
class Stream:
    """One client's stream."""

    index: int
    is_slow: bool
    sent_at: float = 0.0
    first_token_at: float | None = None
    ended_at: float | None = None
    num_tokens: int = 0
    is_done: bool = False
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at


@dataclass
class Target:
    """Where a phase's clients send: host/port per client, the request line's path, body and headers."""

    addresses: list[tuple[str, int]]
    path: str
    body: bytes
    headers: dict[str, str]
    token_marker: bytes  # a token event holds this
    end_marker: bytes  # the stream's last event holds this
    extra: dict[str, Any] = field(default_factory=dict)


async def run_stream(stream: Stream, target: Target, host: str, port: int, slow_read_s: float) -> None:
    """Open one HTTP/1.1 stream and read it to its end (slowly for a slow reader); never raises."""
    try:
        sock = socket.socket()
        if stream.is_slow:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        head = f"POST {target.path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(target.body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in target.headers.items()) + "Connection: close\r\n\r\n"
        stream.sent_at = time.perf_counter()
        writer.write(head.encode() + target.body)
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            stream.error = f"status {status.decode(errors='replace').strip()}"
        keep = max(len(target.token_marker), len(target.end_marker)) - 1
        tail = b""  # the end of the previous read: a marker may straddle two reads
        while True:
            chunk = await reader.read(256 if stream.is_slow else 65536)
            if not chunk:
                break
            seen = tail + chunk
            count = seen.count(target.token_marker)
            if count and stream.first_token_at is None:
                stream.first_token_at = time.perf_counter()
            stream.num_tokens += count
            if target.end_marker in seen:
                stream.is_done = True
            if b'"error"' in seen and stream.error is None:
                stream.error = "error event"
            tail = seen[-keep:]
            if stream.is_slow:
                await asyncio.sleep(slow_read_s)
        writer.close()
    except OSError as exc:
        stream.error = type(exc).__name__
    finally:
        stream.ended_at = time.perf_counter()


async def watch_client_lag(lags_ms: list[float], interval_s: float = 0.001) -> None:
    """Append how late each of this (the client's) event loop's wake-ups every interval_s was, in ms, until
    cancelled: a late client reads a first token late, and its TTFT then holds its own delay."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(interval_s)
        lags_ms.append(1000 * (time.perf_counter() - before - interval_s))


async def run_phase(
    target: Target,
    num: int,
    ramp_s: float,
    slow_every: int,
    slow_read_s: float,
    lags_ms: list[float] | None = None,
) -> list[Stream]:
    """num streams opened evenly over ramp_s, each read to its end (the client's loop lag into lags_ms)."""
    streams = [Stream(i, slow_every > 0 and i % slow_every == slow_every - 1) for i in range(num)]
    tasks = []
    watcher = asyncio.create_task(watch_client_lag(lags_ms if lags_ms is not None else []))
    started = time.perf_counter()
    for stream in streams:
        await asyncio.sleep(max(0.0, started + stream.index * ramp_s / num - time.perf_counter()))
        host, port = target.addresses[stream.index % len(target.addresses)]
        tasks.append(asyncio.create_task(run_stream(stream, target, host, port, slow_read_s)))
    await asyncio.gather(*tasks)
    watcher.cancel()
    return streams


def measured_phase(target: Target, args: argparse.Namespace, lags_ms: list[float]) -> list[Stream]:
    """run_phase with this process's garbage collector off: a full collection of the client's 2,000 streams took
    95-133 ms, a stall of every stream's reads in both phases, not the platform's."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        return asyncio.run(
            run_phase(target, args.num_streams, args.ramp_s, args.slow_every, args.slow_read_s, lags_ms)
        )
    finally:
        gc.enable()
        gc.unfreeze()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def others_cpu_s() -> dict[str, float]:
    """CPU seconds so far of the machine's PostgreSQL and Redis server processes (every backend: the cluster's
    database is one of the machine's server's), by name."""
    totals = {"postgres": 0.0, "redis": 0.0}
    for process in psutil.process_iter(["name"]):
        name = process.info["name"] or ""
        key = (
            "postgres"
            if name.startswith("postgres")
            else "redis"
            if name.startswith("redis-server")
            else None
        )
        if key is not None:
            totals[key] += cpu_s(process.pid)
    return totals


def thread_counters(pid: int) -> dict[str, float]:
    """A process's CPU seconds in its main thread and in its other threads (the API's: the usage writer's), and
    its threads' involuntary context switches (preempted while runnable: by another process or thread) so far."""
    counters = {"main_cpu_s": 0.0, "threads_cpu_s": 0.0, "involuntary_switches": 0.0}
    try:
        threads = psutil.Process(pid).threads()
    except psutil.Error:
        return counters
    for thread in threads:
        key = "main_cpu_s" if thread.id == pid else "threads_cpu_s"
        counters[key] += thread.user_time + thread.system_time
        try:
            status = Path(f"/proc/{pid}/task/{thread.id}/status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        counters["involuntary_switches"] += int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    return counters


class RssSampler(threading.Thread):
    """Peak RSS (bytes) and open descriptors (peak_fds) of each process tree, sampled every interval_s until
    stop(); CPU seconds each process spent between start() and stop() (cpu_used)."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.interval_s = interval_s
        self.peak = dict.fromkeys(pids, 0)
        self.peak_fds = dict.fromkeys(pids, 0)
        self.cpu_used: dict[str, float] = {}
        self.threads_used: dict[str, dict[str, float]] = {}  # thread_counters between start() and stop()
        self._cpu_at_start = {name: cpu_s(pid) for name, pid in pids.items()}
        self._threads_at_start = {name: thread_counters(pid) for name, pid in pids.items()}
        self._is_done = threading.Event()

    def run(self) -> None:
        while not self._is_done.wait(self.interval_s):
            for name, pid in self.pids.items():
                try:
                    root = psutil.Process(pid)
                    procs = [root, *root.children(recursive=True)]
                    rss = sum(p.memory_info().rss for p in procs)
                    num_fds = sum(p.num_fds() for p in procs)
                except psutil.Error:
                    continue
                self.peak[name] = max(self.peak[name], rss)
                self.peak_fds[name] = max(self.peak_fds[name], num_fds)

    def stop(self) -> dict[str, int]:
        self._is_done.set()
        self.join()
        self.cpu_used = {name: cpu_s(pid) - self._cpu_at_start[name] for name, pid in self.pids.items()}
        for name, pid in self.pids.items():
            now, before = thread_counters(pid), self._threads_at_start[name]
            self.threads_used[name] = {key: round(now[key] - before[key], 2) for key in now}
        return self.peak


def start_profilers(pids: dict[str, int], out_dir: Path, tag: str) -> list[subprocess.Popen[bytes]]:
    """py-spy record (collapsed stacks, 100 Hz, idle frames dropped) of each process into out_dir/<name>-<tag>.txt,
    until stop_profilers."""
    out_dir.mkdir(parents=True, exist_ok=True)
    py_spy = str(Path(sys.executable).parent / "py-spy")
    profilers = []
    for name, pid in pids.items():
        out = str(out_dir / f"{name}-{tag}.txt")
        command = [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "100",
            "--format",
            "raw",
            "--output",
            out,
            "--nonblocking",
        ]
        profilers.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return profilers


def stop_profilers(profilers: list[subprocess.Popen[bytes]]) -> None:
    """Stop py-spy and let it write its output."""
    for profiler in profilers:
        profiler.send_signal(signal.SIGINT)
    for profiler in profilers:
        profiler.wait(60)


def summary(phase: str, streams: list[Stream], num_tokens: int) -> dict[str, Any]:
    """TTFT percentiles (ms) of the streams read at full speed (a slow reader's first read waits on itself) and
    the outcomes of every stream."""
    ttfts = sorted(1000 * s.ttft_s for s in streams if s.ttft_s is not None and not s.is_slow)
    errors: dict[str, int] = {}
    for s in streams:
        kind = s.error or (None if s.is_done and s.num_tokens == num_tokens else "incomplete")
        if kind:
            errors[kind] = errors.get(kind, 0) + 1
    slow = [s for s in streams if s.is_slow and s.ended_at is not None]
    by_quarter = []  # TTFT p99 of the streams opened in each quarter of the ramp: where in it the tail is
    for quarter in range(4):
        part = sorted(
            1000 * s.ttft_s
            for s in streams[quarter * len(streams) // 4 : (quarter + 1) * len(streams) // 4]
            if s.ttft_s is not None and not s.is_slow
        )
        by_quarter.append(round(part[min(len(part) - 1, int(0.99 * len(part)))], 1) if part else None)
    return {
        "phase": phase, "num_streams": len(streams), "num_complete": sum(s.is_done for s in streams),
        "ttft_p50_ms": round(statistics.median(ttfts), 1) if ttfts else None,
        "ttft_p99_ms": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1) if ttfts else None,
        "ttft_p99_by_quarter_ms": by_quarter, "slow_readers": len(slow), "errors": errors,
    }  # fmt: skip


def lag_summary(lags_ms: list[float]) -> dict[str, float | int]:
    """p50, p99 and max of the client's loop lag (ms), and how many wake-ups were over 10 ms late."""
    ordered = sorted(lags_ms) or [0.0]
    return {
        "p50": round(ordered[len(ordered) // 2], 2), "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 2),
        "max": round(ordered[-1], 1), "over_10ms": sum(lag > 10 for lag in ordered),
    }  # fmt: skip


def stage_buckets(api_urls: list[str], admin_key: str) -> dict[str, dict[float, float]]:
    """The replicas' lorahost_request_stage_ms buckets summed: stage -> {upper bound ms: cumulative count}; the
    event loop's lag (lorahost_event_loop_lag_ms) as stage "loop_lag", garbage collections' pauses
    (lorahost_gc_pause_ms) as "gc0", "gc1", "gc2"."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[str, dict[float, float]] = {}
    for url in api_urls:
        answer = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {admin_key}"}, timeout=30)
        text = answer.raise_for_status().text
        for family in text_string_to_metric_families(text):
            if family.name not in (
                "lorahost_request_stage_ms",
                "lorahost_event_loop_lag_ms",
                "lorahost_gc_pause_ms",
            ):
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    name = sample.labels.get("stage", "loop_lag")
                    if "generation" in sample.labels:
                        name = f"gc{sample.labels['generation']}"
                    per_stage = buckets.setdefault(name, {})
                    bound = float(sample.labels["le"])
                    per_stage[bound] = per_stage.get(bound, 0.0) + sample.value
    return buckets


def stage_quantiles(
    before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]
) -> dict[str, list[float]]:
    """Per request stage, the bucket bounds (ms) holding the p50 and the p99 of the requests between two scrapes."""
    quantiles = {}
    for stage, counts in after.items():
        if stage.startswith("gc"):
            continue
        delta = sorted((bound, n - before.get(stage, {}).get(bound, 0.0)) for bound, n in counts.items())
        total = delta[-1][1] if delta else 0.0
        if total:
            quantiles[stage] = [next(b for b, n in delta if n >= q * total) for q in (0.5, 0.99)]
    return quantiles


def gc_pauses(before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]) -> dict[str, Any]:
    """Per generation, the replicas' garbage collections between two scrapes: how many, how many over 10 ms, and
    the bucket bound (ms) holding the longest."""
    pauses = {}
    for name, counts in after.items():
        if name.startswith("gc"):
            delta = sorted((bound, n - before.get(name, {}).get(bound, 0.0)) for bound, n in counts.items())
            total = delta[-1][1] if delta else 0.0
            under_10 = max((n for bound, n in delta if bound <= 10.0), default=0.0)
            longest = next((bound for bound, n in delta if n >= total), None) if total else None
            pauses[name] = {"count": int(total), "over_10ms": int(total - under_10), "max_bucket_ms": longest}
    return pauses


def register_stub(cluster: DevCluster, url: str, num_streams: int, stop: threading.Event) -> threading.Thread:
    """Keep the stub in the cluster's worker directory (a heartbeat a second) until stop is set."""
    import redis

    record = WorkerRecord(WORKER_ID, url, cluster.config.base_model_name, max_num_seqs=4 * num_streams)

    def beat() -> None:
        client = redis.Redis.from_url(cluster.config.redis_url)
        directory = RedisWorkerDirectory(client, cluster.worker_key_prefix)
        while not stop.is_set():
            directory.heartbeat(record, ttl_s=6.0)
            stop.wait(1.0)
        directory.remove(WORKER_ID)
        client.close()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    return thread


def tenant_key(api_url: str, admin_key: str, num_streams: int, num_tokens: int) -> str:
    """A tenant on a plan whose limits the run stays under; its key."""
    admin = {"Authorization": f"Bearer {admin_key}"}
    plan = httpx.post(f"{api_url}/v1/admin/plans", headers=admin, json={
        "name": "many-streams", "price_per_1m_prompt_tokens": "0.5", "price_per_1m_completion_tokens": "1.5",
        "price_storage_per_adapter_day": "0.01", "requests_per_min": 20 * num_streams,
        "tokens_per_min": 40 * num_streams * (num_tokens + 64)}, timeout=30)  # fmt: skip
    plan.raise_for_status()
    tenant = httpx.post(
        f"{api_url}/v1/admin/tenants", headers=admin, json={"name": "many-streams"}, timeout=30
    )
    tenant.raise_for_status()
    tenant_id = tenant.json()["id"]
    httpx.patch(f"{api_url}/v1/admin/tenants/{tenant_id}", headers=admin, json={"plan_id": plan.json()["id"]},
                timeout=30).raise_for_status()  # fmt: skip
    key = httpx.post(f"{api_url}/v1/admin/tenants/{tenant_id}/keys", headers=admin, timeout=30)
    key.raise_for_status()
    return str(key.json()["key"])


def pin(args: argparse.Namespace, stub_pid: int, api_pids: list[int]) -> dict[int, list[int]]:
    """Confine the load (this client and the stub) to --load-cpus, and the platform (the API replicas with their
    children, and the PostgreSQL and Redis servers) to --platform-cpus; returns the servers' former affinities
    (theirs are restored after the run, the cluster's own processes end with it)."""
    former: dict[int, list[int]] = {}
    if args.load_cpus:
        for pid in (os.getpid(), stub_pid):
            os.sched_setaffinity(pid, args.load_cpus)
    if args.platform_cpus:
        servers = [p for p in psutil.process_iter(["name"]) if p.info["name"] in ("postgres", "redis-server")]
        apis = [psutil.Process(pid) for pid in api_pids]
        for proc in [*apis, *(c for a in apis for c in a.children(recursive=True)), *servers]:
            try:
                if proc in servers:
                    former[proc.pid] = proc.cpu_affinity()
                proc.cpu_affinity(args.platform_cpus)
            except psutil.Error:  # a backend that ended meanwhile
                pass
    return former


def unpin(former: dict[int, list[int]]) -> None:
    """Give the shared servers their former affinities back (a backend forked meanwhile ends with its client)."""
    for pid, cpus in former.items():
        try:
            psutil.Process(pid).cpu_affinity(cpus)
        except psutil.Error:
            pass


def run(args: argparse.Namespace) -> None:
    model_dir = args.model_dir or Path(os.path.expanduser(f"~/.cache/lorahost/bench-{args.size}-2"))
    ensure_model(model_dir, sys.executable, 2, args.size)
    work = Path(tempfile.mkdtemp(prefix="lorahost-many-streams-"))
    stub_port = free_port()
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(stub_port), str(args.pace_s)],
                            stdout=subprocess.DEVNULL, stderr=(work / "stub.log").open("wb"))  # fmt: skip
    stub_url = f"http://127.0.0.1:{stub_port}"
    config = DevClusterConfig(data_dir=work / "cluster", base_model=model_dir / "base", num_api=2, num_workers=0,
                              is_jobs_enabled=False, start_timeout_s=240,
                              env={"LORAHOST_USAGE_CHECKPOINT_INTERVAL_S": os.environ.get("LORAHOST_USAGE_CHECKPOINT_INTERVAL_S", "1")})  # fmt: skip
    stop = threading.Event()
    results: list[dict[str, Any]] = []
    pinned: dict[int, list[int]] = {}
    try:
        with DevCluster(config) as cluster:
            heartbeat = register_stub(cluster, stub_url, args.num_streams, stop)
            peers = peer_ports([("postgres", cluster.database_url), ("redis", cluster.config.redis_url),
                                ("worker", stub_url), *(("api", url) for url in cluster.api_urls)])  # fmt: skip
            cluster.wait_live_workers(lambda ids: WORKER_ID in ids, timeout_s=30)
            key = tenant_key(cluster.api_url, cluster.admin_key, args.num_streams, args.num_tokens)
            direct = Target(
                [("127.0.0.1", stub_port)], "/internal/v1/generate",
                json.dumps({"request_id": "r", "prompt": "many streams",
                            "sampling": {"max_tokens": args.num_tokens}}).encode(),
                {"Content-Type": "application/json", "Authorization": f"Bearer {cluster.internal_token}"},
                b'"type": "delta"', b'"type": "final"',
            )  # fmt: skip
            apis = [("127.0.0.1", int((api.url or "").rsplit(":", 1)[1])) for api in cluster.apis]
            platform = Target(
                apis, "/v1/completions",
                json.dumps({"model": cluster.config.base_model_name, "prompt": "many streams",
                            "max_tokens": args.num_tokens, "ignore_eos": True, "stream": True}).encode(),
                {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
                b'"finish_reason":null', b"data: [DONE]",
            )  # fmt: skip
            pinned.update(pin(args, stub.pid, [api.pid for api in cluster.apis if api.pid is not None]))
            # a warm-up through the platform: caches, connections, the first request's imports
            asyncio.run(run_phase(platform, 8, 0.5, 0, 0.0))
            for phase, target in (("direct", direct), ("platform", platform)) * args.rounds:
                pids = {api.name: api.pid for api in cluster.apis}
                pids["stub"] = stub.pid
                sampler = RssSampler(pids)
                sampler.start()
                profilers = []
                if args.profile_dir is not None and phase == "platform":
                    profilers = start_profilers(pids, args.profile_dir, f"round{len(results) // 2 + 1}")
                api_urls = [api.url or "" for api in cluster.apis]
                stages_before = stage_buckets(api_urls, cluster.admin_key)
                lags_ms: list[float] = []
                others_before = others_cpu_s()
                client_before_s = time.thread_time()
                streams = measured_phase(target, args, lags_ms)
                client_cpu_s = time.thread_time() - client_before_s
                peaks = sampler.stop()
                stop_profilers(profilers)
                row = summary(phase, streams, args.num_tokens)
                row["client_loop_lag_ms"] = lag_summary(lags_ms)
                if phase == "platform":  # each stage's p50 and p99 at the API, as histogram bucket bounds
                    stages_after = stage_buckets(api_urls, cluster.admin_key)
                    row["stage_p50_p99_ms"] = stage_quantiles(stages_before, stages_after)
                    row["api_gc_pauses"] = gc_pauses(stages_before, stages_after)
                row["api_peak_rss_mib"] = {
                    name: round(v / 2**20, 1) for name, v in peaks.items() if name != "stub"
                }
                row["cpu_s"] = {name: round(v, 1) for name, v in sampler.cpu_used.items()}
                row["cpu_s"]["client"] = round(
                    client_cpu_s, 1
                )  # the load generator's event loop (this thread)
                row["cpu_s"].update(
                    {name: round(v - others_before[name], 1) for name, v in others_cpu_s().items()}
                )
                row["api_threads"] = {n: v for n, v in sampler.threads_used.items() if n != "stub"}
                # what each API holds once its streams ended: pools (DB, Redis, idle worker connections)
                row["api_peak_fds"] = {n: v for n, v in sampler.peak_fds.items() if n != "stub"}
                row["api_fds_after"] = {n: dict(tree_fd_kinds(pid, peers).counts) for n, pid in pids.items()
                                        if n != "stub"}  # fmt: skip
                results.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
            stop.set()
            heartbeat.join(5)
    finally:
        unpin(pinned)
        stop.set()
        stub.terminate()
        stub.wait(10)
    by_phase = {p: [r for r in results if r["phase"] == p] for p in ("direct", "platform")}
    medians = {p: {k: statistics.median(r[k] for r in rows if r[k] is not None)
                   for k in ("ttft_p50_ms", "ttft_p99_ms")} for p, rows in by_phase.items()}  # fmt: skip
    line = {
        "bench": "many_streams", "num_streams": args.num_streams, "num_tokens": args.num_tokens,
        "pace_s": args.pace_s, "ramp_s": args.ramp_s, "slow_every": args.slow_every, "rounds": results,
        "overhead_ttft_p50_ms": round(medians["platform"]["ttft_p50_ms"] - medians["direct"]["ttft_p50_ms"], 1),
        "overhead_ttft_p99_ms": round(medians["platform"]["ttft_p99_ms"] - medians["direct"]["ttft_p99_ms"], 1),
        "api_peak_rss_mib": max(max(r["api_peak_rss_mib"].values()) for r in by_phase["platform"]),
        "cpu": cpu_model(), "commit": git_state().get("commit"), "load_avg": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip
    print(
        f"{'phase':9} {'streams':>7} {'complete':>8} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'API peak RSS MiB':>17}"
        f" {'CPU s (APIs, stub)':>19} {'API main, threads s':>19} {'preempted':>9} {'client, PG, Redis s':>19}"
    )
    for r in results:
        api_cpu = sum(v for name, v in r["cpu_s"].items() if name.startswith("api-"))
        cpu = f"{api_cpu:.1f}, {r['cpu_s']['stub']:.1f}"
        threads = r["api_threads"].values()
        split = f"{sum(t['main_cpu_s'] for t in threads):.1f}, {sum(t['threads_cpu_s'] for t in threads):.1f}"
        preempted = int(sum(t["involuntary_switches"] for t in threads))
        load = f"{r['cpu_s']['client']:.1f}, {r['cpu_s']['postgres']:.1f}, {r['cpu_s']['redis']:.1f}"
        print(f"{r['phase']:9} {r['num_streams']:>7} {r['num_complete']:>8} {r['ttft_p50_ms']!s:>11} "
              f"{r['ttft_p99_ms']!s:>11} {max(r['api_peak_rss_mib'].values()):>17} {cpu:>19} {split:>19} "
              f"{preempted:>9} {load:>19}  {r['errors'] or ''}")  # fmt: skip
    print(
        f"platform overhead on TTFT: p50 {line['overhead_ttft_p50_ms']} ms, p99 {line['overhead_ttft_p99_ms']} ms"
    )
    print(json.dumps(line))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(json.dumps(line) + "\n")


def cpu_list(text: str) -> list[int]:
    """`0,1` -> [0, 1]."""
    return [int(c) for c in text.split(",") if c.strip()]


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on the way out (its `with`)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-streams", type=int, default=2000)
    p.add_argument("--num-tokens", type=int, default=30, help="tokens per stream")
    p.add_argument("--pace-s", type=float, default=1.0, help="seconds between a stream's tokens")
    p.add_argument("--ramp-s", type=float, default=10.0, help="seconds over which the streams are opened")
    p.add_argument("--slow-every", type=int, default=10, help="every n-th client reads slowly (0: none)")
    p.add_argument("--slow-read-s", type=float, default=2.0, help="a slow reader's pause between reads")
    p.add_argument("--rounds", type=int, default=2, help="direct, platform, repeated")
    p.add_argument("--size", default="tiny")
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--profile-dir", type=Path, default=None,
                   help="py-spy the API replicas and the stub in each platform phase (collapsed stacks here)")  # fmt: skip
    p.add_argument("--load-cpus", type=cpu_list, default=[],
                   help="CPUs (e.g. 1) for the client and the stub: the load off the platform's cores")  # fmt: skip
    p.add_argument("--platform-cpus", type=cpu_list, default=[],
                   help="CPUs (e.g. 0) for the API replicas, PostgreSQL and Redis")  # fmt: skip
    main_args = p.parse_args(argv)
    run(main_args)


if __name__ == "__main__":
    main()
