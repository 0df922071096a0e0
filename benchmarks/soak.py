"""Soak (issue 38 item 2): mixed traffic on a dev-cluster for --duration-s at --load of its measured capacity,
with every process's resources sampled, to find what grows.

    python benchmarks/soak.py [--duration-s 1800] [--load 0.7] [--out FILE] [--plot PNG] [--samples JSONL]

The cluster: 2 API replicas, 2 workers, Celery (worker + beat), PostgreSQL, Redis, a moto S3 server; the tiny
demo model. --num-tenants tenants share --num-adapters adapters (distinct files within a tenant).
Capacity: --calibrate-s of closed-loop traffic (--calibrate-clients clients, each sending the next request when
its last one ends) gives completed requests per second; the soak then sends open-loop (Poisson) arrivals at
--load times that. Traffic, all at once:
- inference: a random tenant's random adapter (or the base model), half streamed, 8-48 tokens, over the replicas;
- churn: every --churn-s a tenant uploads a new adapter, and deletes the one it uploaded two rounds before;
- reads: every --reads-s one of the console pages (tenant: usage, adapters; operator: billing, SLO) and the REST
  reports (/v1/usage, /v1/admin/billing, /v1/admin/slo), in turn.
Sampled every --sample-s: RSS, open file descriptors and threads of every process of the cluster (with its
children), PostgreSQL connections to the cluster's database, and Redis keys under the cluster's prefix.
Each sample also breaks every process's descriptors down by kind (benchmarks/fd_kinds.py: sockets by peer,
pipes, files, ...). At rest: after the calibration and again after the soak, no traffic for --settle-s (past
the keep-alive of every hop, so idle connections are closed), one sample with the paths of open files: what a
process holds then, before against after, is what the soak left behind (a pool grown to its bound, or a leak).
Printed: per process and metric, the growth over the last 20 minutes (or the last two thirds of a shorter run):
the median of its last --window-n samples against the median of the first --window-n samples of that span
(goal: < 5%); descriptors and RSS at rest, before and after, with what changed by kind; every answer that was
not a success, by kind; latency of the first and last thirds. Not a test: numbers depend on the machine (its
CPU is printed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from cluster_load import ADAPTER_FILES
from fd_kinds import diff, peer_ports, tree_fd_kinds
from model_dirs import ensure_model
from run_info import cpu_model, git_state

from lorahost.demo import setup_tenant
from lorahost.dev_cluster import DevCluster
from lorahost.dev_cluster_config import DevClusterConfig

LOGIN_CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')
LAST_SPAN_S = 1200.0  # the goal's "last 20 minutes"
REQUEST_TIMEOUT_S = 120.0
LATENCY_PERIOD_S = 300.0  # the latency printed per period of the soak


@dataclass
class Tenant:
    """A tenant of the soak: its key and the adapters it can call now."""

    tenant_id: str
    key: str
    adapters: list[str]
    churned: list[str] = field(default_factory=list)  # uploaded by the churn, oldest first

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@dataclass
class Stats:
    """What the clients got, thread-safe."""

    answers: Counter[str] = field(default_factory=Counter)  # "inference 200", "churn-upload 202", ...
    latencies: list[tuple[float, float]] = field(
        default_factory=list
    )  # (sent at, seconds) of completed inference
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, status: int | str) -> None:
        with self.lock:
            self.answers[f"{kind} {status}"] += 1


def upload(api_url: str, tenant: Tenant, name: str, adapter_dir: Path) -> int:
    """One adapter upload; its HTTP status (0: the connection failed)."""
    files = [("files", (n, (adapter_dir / n).read_bytes())) for n in ADAPTER_FILES]
    try:
        return httpx.post(f"{api_url}/v1/adapters", headers=tenant.headers, data={"name": name}, files=files,
                          timeout=REQUEST_TIMEOUT_S).status_code  # fmt: skip
    except httpx.HTTPError:
        return 0


def wait_ready(api_url: str, tenant: Tenant, names: list[str], timeout_s: float = 600.0) -> None:
    """Until every named adapter of the tenant has a ready version."""
    pending = set(names)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            body = httpx.get(f"{api_url}/v1/adapters/{name}", headers=tenant.headers, timeout=30).json()
            if body.get("latest_ready_version"):
                pending.discard(name)
        time.sleep(0.5)
    if pending:
        raise RuntimeError(f"adapters never ready: {sorted(pending)[:5]}")


def infer(api_url: str, tenant: Tenant, model: str, is_stream: bool, max_tokens: int, seed: int) -> int:
    """One completion read to its end; its HTTP status (0: the connection broke; 599: a stream's error event)."""
    body: dict[str, Any] = {"model": model, "prompt": f"soak request {seed}", "max_tokens": max_tokens,
                            "ignore_eos": True, "temperature": 1.0, "seed": seed, "stream": is_stream}  # fmt: skip
    try:
        with httpx.Client(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10)) as http:
            if not is_stream:
                return http.post(f"{api_url}/v1/completions", json=body, headers=tenant.headers).status_code
            with http.stream(
                "POST", f"{api_url}/v1/completions", json=body, headers=tenant.headers
            ) as response:
                is_error = any(line.startswith('data: {"error"') for line in response.iter_lines())
                return 599 if response.status_code == 200 and is_error else response.status_code
    except httpx.HTTPError:
        return 0


class Soak:
    """The cluster, its tenants and the traffic threads."""

    def __init__(
        self, cluster: DevCluster, tenants: list[Tenant], adapter_dirs: list[Path], seed: int
    ) -> None:
        self.cluster = cluster
        self.tenants = tenants
        self.adapter_dirs = adapter_dirs
        self.stats = Stats()
        self.stop = threading.Event()
        self.random = random.Random(seed)
        self._seeds = itertools.count()
        self._threads: list[threading.Thread] = []

    def one_inference(self, record: bool = True) -> float:
        """Send one random request; its latency in seconds."""
        tenant = self.random.choice(self.tenants)
        model = self.random.choice([*tenant.adapters, self.cluster.config.base_model_name])
        n = next(self._seeds)
        started, sent_at = time.monotonic(), time.time()
        status = infer(self.cluster.next_api_url(), tenant, model, n % 2 == 0, 8 + n % 41, n)
        elapsed = time.monotonic() - started
        if record:
            self.stats.record("inference", status)
            if status == 200:
                with self.stats.lock:
                    self.stats.latencies.append((sent_at, elapsed))
        return elapsed

    def calibrate(self, num_clients: int, duration_s: float) -> float:
        """Completed requests per second of a closed loop of num_clients clients."""
        done: list[float] = []
        deadline = time.monotonic() + duration_s

        def client() -> None:
            while time.monotonic() < deadline:
                done.append(self.one_inference(record=False))  # list.append is atomic

        threads = [threading.Thread(target=client, daemon=True) for _ in range(num_clients)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return len(done) / (time.monotonic() - started)

    def start(self, rate: float, churn_s: float, reads_s: float) -> None:
        """The three traffic threads."""
        for target, args in ((self._arrivals, (rate,)), (self._churn, (churn_s,)), (self._reads, (reads_s,))):
            thread = threading.Thread(target=target, args=args, daemon=True)
            thread.start()
            self._threads.append(thread)

    def finish(self) -> None:
        """Stop the traffic and wait for what is in flight."""
        self.stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 30)

    def _arrivals(self, rate: float) -> None:
        in_flight: list[threading.Thread] = []
        next_at = time.monotonic()
        while not self.stop.is_set():
            thread = threading.Thread(target=self.one_inference, daemon=True)
            thread.start()
            in_flight = [t for t in in_flight if t.is_alive()] + [thread]
            next_at += self.random.expovariate(rate)
            self.stop.wait(max(0.0, next_at - time.monotonic()))
        for thread in in_flight:
            thread.join(REQUEST_TIMEOUT_S)

    def _churn(self, every_s: float) -> None:
        for n in itertools.count():
            if self.stop.wait(every_s):
                return
            tenant = self.tenants[n % len(self.tenants)]
            name = f"churn-{n}"
            status = upload(
                self.cluster.next_api_url(), tenant, name, self.adapter_dirs[n % len(self.adapter_dirs)]
            )
            self.stats.record("churn-upload", status)
            if status in (201, 202):
                tenant.churned.append(name)
            if len(tenant.churned) > 2:
                old = tenant.churned.pop(0)
                try:
                    status = httpx.delete(f"{self.cluster.next_api_url()}/v1/adapters/{old}", headers=tenant.headers,
                                          timeout=REQUEST_TIMEOUT_S).status_code  # fmt: skip
                except httpx.HTTPError:
                    status = 0
                self.stats.record("churn-delete", status)

    def _reads(self, every_s: float) -> None:
        tenant = self.tenants[0]
        admin = {"Authorization": f"Bearer {self.cluster.admin_key}"}
        pages = [("console", "/console/usage", tenant.key), ("console", "/console/adapters", tenant.key),
                 ("console", "/console/admin/billing", self.cluster.admin_key),
                 ("console", "/console/admin/slo", self.cluster.admin_key),
                 ("rest", "/v1/usage", tenant.headers), ("rest", "/v1/admin/billing", admin),
                 ("rest", "/v1/admin/slo?group_by=tenant", admin)]  # fmt: skip
        consoles: dict[tuple[str, str], httpx.Client] = {}  # (API URL, key) -> a signed-in browser
        try:
            for kind, path, credential in itertools.cycle(pages):
                if self.stop.wait(every_s):
                    return
                url = self.cluster.next_api_url()
                try:
                    if isinstance(credential, dict):
                        status = httpx.get(
                            url + path, headers=credential, timeout=REQUEST_TIMEOUT_S
                        ).status_code
                    else:
                        browser = consoles.get((url, credential))
                        if browser is None:
                            browser = consoles[url, credential] = console_browser(url, credential)
                        status = browser.get(path).status_code
                except httpx.HTTPError:
                    status = 0
                self.stats.record(f"read {path.split('?')[0]}", status)
        finally:
            for browser in consoles.values():
                browser.close()


def console_browser(api_url: str, key: str) -> httpx.Client:
    """A client signed in to the console with `key` (once, as a user would), following no redirect: a page
    that answers 303 sends it back to sign-in."""
    browser = httpx.Client(base_url=api_url, timeout=REQUEST_TIMEOUT_S)
    form = browser.get("/console/login").text
    match = LOGIN_CSRF_RE.search(form)
    if match is None:
        raise RuntimeError("the console's sign-in form has no CSRF token")
    response = browser.post("/console/login", data={"key": key, "csrf_token": match.group(1)})
    if response.status_code != 303:
        raise RuntimeError(f"console sign-in answered {response.status_code}: {response.text[:200]}")
    return browser


def process_sample(pid: int) -> dict[str, int]:
    """RSS (bytes), open fds and threads of a process and its children (zeros when it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {"rss": 0, "fds": 0, "threads": 0}
    total = {"rss": 0, "fds": 0, "threads": 0}
    for proc in procs:
        try:
            with proc.oneshot():
                total["rss"] += proc.memory_info().rss
                total["fds"] += proc.num_fds()
                total["threads"] += proc.num_threads()
        except psutil.Error:
            continue
    return total


def cluster_peers(cluster: DevCluster) -> dict[int, str]:
    """Port -> the cluster's service listening there, to name the peers of a process's sockets."""
    urls = [("postgres", cluster.database_url), ("redis", cluster.config.redis_url),
            ("s3", cluster.services.s3_endpoint), *(("api", url) for url in cluster.api_urls),
            *(("worker", w.url) for w in cluster.workers)]  # fmt: skip
    return peer_ports(urls)


def cluster_sample(cluster: DevCluster, started: float, is_at_rest: bool = False) -> dict[str, Any]:
    """One sample of every process (descriptors by kind too; at rest, with the paths of open files), the
    database's connections and the Redis keys of the cluster."""
    import redis
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    processes = {api.name: api.pid for api in cluster.apis}
    processes |= {w.worker_id: w.process.pid for w in cluster.workers}
    if cluster.jobs is not None:
        processes["jobs"] = cluster.jobs.pid
    database = (cluster.database_url or "").rsplit("/", 1)[-1]
    engine = create_engine(cluster.config.postgres_admin_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            num_db = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d"), {"d": database}
            ).scalar()
    finally:
        engine.dispose()
    client = redis.Redis.from_url(cluster.config.redis_url)
    try:
        num_keys = sum(1 for _ in client.scan_iter(match=f"{cluster.key_prefix}*", count=1000))
        num_keys += sum(1 for _ in client.scan_iter(match=f"*{cluster.celery_queue}*", count=1000))
    finally:
        client.close()
    peers = cluster_peers(cluster)
    fds = {name: tree_fd_kinds(pid, peers).as_json() for name, pid in processes.items()}
    if not is_at_rest:
        fds = {name: {"counts": kinds["counts"]} for name, kinds in fds.items()}
    return {"t_s": round(time.monotonic() - started, 1),
            "processes": {name: process_sample(pid) for name, pid in processes.items()},
            "fd_kinds": fds, "db_connections": int(num_db or 0), "redis_keys": num_keys}  # fmt: skip


def at_rest(cluster: DevCluster, started: float, settle_s: float) -> dict[str, Any]:
    """A sample after settle_s without traffic: past every hop's keep-alive, idle connections are closed."""
    time.sleep(settle_s)
    return cluster_sample(cluster, started, is_at_rest=True)


def rest_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per process, its descriptors and RSS at rest before and after the soak, and what changed by kind."""
    out: dict[str, Any] = {}
    for name, values in after["processes"].items():
        if name not in before["processes"]:
            continue
        was = before["processes"][name]
        out[name] = {"fds": [was["fds"], values["fds"]], "rss_mib": [round(was["rss"] / 2**20, 1),
                     round(values["rss"] / 2**20, 1)], "fd_changes": diff(before["fd_kinds"][name],
                     after["fd_kinds"][name])}  # fmt: skip
    out["db_connections"] = [before["db_connections"], after["db_connections"]]
    out["redis_keys"] = [before["redis_keys"], after["redis_keys"]]
    return out


# a request's own sockets (and idle ones kept 5 s for reuse), and sockets opening or closing as they were read
TRAFFIC_FD_KINDS = ("inbound", "worker", "api", "socket-other")


def series(samples: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """'<process> <metric>' and the cluster-wide ones -> [(t_s, value)]. `held-fds`: the descriptors that are
    not the traffic's sockets (TRAFFIC_FD_KINDS): pools, files, pipes, ... what a leak would grow."""
    out: dict[str, list[tuple[float, float]]] = {}
    for sample in samples:
        for name, values in sample["processes"].items():
            for metric, value in values.items():
                out.setdefault(f"{name} {metric}", []).append((sample["t_s"], value))
            kinds = sample.get("fd_kinds", {}).get(name, {}).get("counts")
            if kinds:  # from the same reading of the descriptors
                held = sum(n for kind, n in kinds.items() if kind not in TRAFFIC_FD_KINDS)
                out.setdefault(f"{name} held-fds", []).append((sample["t_s"], held))
        for metric in ("db_connections", "redis_keys"):
            out.setdefault(metric, []).append((sample["t_s"], sample[metric]))
    return out


def growth(points: list[tuple[float, float]], span_s: float, window_n: int) -> float | None:
    """Relative growth over the last span_s: median of the last window_n values vs the first window_n of the span."""
    end = points[-1][0]
    span = [v for t, v in points if t >= end - span_s]
    if len(span) < 2 * window_n:
        return None
    first, last = statistics.median(span[:window_n]), statistics.median(span[-window_n:])
    return round((last - first) / first, 4) if first else None


def plot(samples: list[dict[str, Any]], path: Path, title: str) -> None:
    """One panel per metric: every process's line, then the database's connections and the Redis keys."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(samples)
    panels = [("rss", "RSS change since the start (MiB)", 1 / 2**20),
              ("fds", "open fds (dashed: held, without the traffic's sockets)", 1.0),
              ("threads", "threads", 1.0)]  # fmt: skip
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for ax, (metric, label, scale) in zip(axes, panels, strict=False):
        for name, points in data.items():
            if name.endswith(" " + metric):
                base = points[0][1] if metric == "rss" else 0.0  # processes of very different sizes, one axis
                ax.plot([t / 60 for t, _ in points], [(v - base) * scale for _, v in points],
                        label=name.rsplit(" ", 1)[0])  # fmt: skip
            elif metric == "fds" and name.endswith(" held-fds"):  # dashed: without the traffic's sockets
                ax.plot([t / 60 for t, _ in points], [v for _, v in points], linestyle="--",
                        label=name.replace(" held-fds", " held"))  # fmt: skip
        ax.set_title(label)
        ax.set_xlabel("minutes")
    for name in ("db_connections", "redis_keys"):
        axes[3].plot([t / 60 for t, _ in data[name]], [v for _, v in data[name]], label=name)
    axes[3].set_title("PostgreSQL connections, Redis keys")
    axes[3].set_xlabel("minutes")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def run(args: argparse.Namespace) -> None:
    per_tenant = -(-args.num_adapters // args.num_tenants)
    model_dir = args.model_dir or Path(
        os.path.expanduser(f"~/.cache/lorahost/bench-{args.size}-{per_tenant}")
    )
    ensure_model(model_dir, sys.executable, per_tenant, args.size)
    adapter_dirs = sorted((model_dir / "adapters").iterdir())
    if len(adapter_dirs) < per_tenant:
        raise SystemExit(f"{model_dir} has {len(adapter_dirs)} adapters; {per_tenant} per tenant are needed")
    env = {"LORAHOST_ENGINE_NUM_THREADS": "1", "LORAHOST_USAGE_CHECKPOINT_INTERVAL_S": "1"}
    work = Path(tempfile.mkdtemp(prefix="lorahost-soak-"))
    config = DevClusterConfig(data_dir=work / "cluster", base_model=model_dir / "base", num_api=2, num_workers=2,
                              env=env, start_timeout_s=240)  # fmt: skip
    samples: list[dict[str, Any]] = []
    with DevCluster(config) as cluster:
        tenants = []
        for n in range(args.num_tenants):
            tenant_id, key = setup_tenant(cluster.api_url, cluster.admin_key)
            names = [f"soak-{n}-{i}" for i in range(min(per_tenant, args.num_adapters - n * per_tenant))]
            tenants.append(Tenant(tenant_id, key, names))
            for name, adapter_dir in zip(names, adapter_dirs, strict=False):
                status = upload(cluster.next_api_url(), tenants[-1], name, adapter_dir)
                if status not in (201, 202):
                    raise RuntimeError(f"upload of {name} answered {status}")
        for tenant in tenants:
            wait_ready(cluster.api_url, tenant, tenant.adapters)
        soak = Soak(cluster, tenants, adapter_dirs, args.seed)
        capacity = soak.calibrate(args.calibrate_clients, args.calibrate_s)
        rate = args.load * capacity
        print(
            json.dumps({"capacity_rps": round(capacity, 2), "rate_rps": round(rate, 2)}),
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        rest_before = at_rest(cluster, started, args.settle_s)
        started = time.monotonic()
        soak.start(rate, args.churn_s, args.reads_s)
        while time.monotonic() - started < args.duration_s:
            samples.append(cluster_sample(cluster, started))
            if args.samples:
                with args.samples.open("a") as f:
                    f.write(json.dumps(samples[-1]) + "\n")
            time.sleep(max(0.0, args.sample_s - (time.monotonic() - started) % args.sample_s))
        soak.finish()
        samples.append(cluster_sample(cluster, started))
        rest_after = at_rest(cluster, started, args.settle_s)
        if args.samples:
            with args.samples.open("a") as f:
                for rest in (rest_before, rest_after):
                    f.write(json.dumps({"at_rest": rest}) + "\n")
    span_s = min(LAST_SPAN_S, args.duration_s * 2 / 3)
    growths = {name: growth(points, span_s, args.window_n) for name, points in series(samples).items()}
    growths = {k: v for k, v in growths.items() if v is not None}
    thirds = args.duration_s / 3
    first = [s for t, s in soak.stats.latencies if t - soak.stats.latencies[0][0] < thirds]
    last = [s for t, s in soak.stats.latencies if t - soak.stats.latencies[0][0] >= 2 * thirds]
    failures = {k: v for k, v in soak.stats.answers.items() if not k.endswith((" 200", " 201", " 202"))}
    summary = {
        "bench": "soak", "duration_s": args.duration_s, "span_s": span_s, "load": args.load,
        "capacity_rps": round(capacity, 2), "rate_rps": round(rate, 2),
        "num_requests": sum(v for k, v in soak.stats.answers.items() if k.startswith("inference")),
        "answers": dict(sorted(soak.stats.answers.items())), "failures": failures,
        "max_growth": max(growths.items(), key=lambda kv: kv[1], default=None),
        "growth": dict(sorted(growths.items())), "at_rest": rest_changes(rest_before, rest_after),
        "latency_first_third_p50_s": round(statistics.median(first), 3) if first else None,
        "latency_last_third_p50_s": round(statistics.median(last), 3) if last else None,
        "latency_first_third_p99_s": round(statistics.quantiles(first, n=100)[98], 3) if len(first) > 1 else None,
        "latency_last_third_p99_s": round(statistics.quantiles(last, n=100)[98], 3) if len(last) > 1 else None,
        "latency_p50_s_by_5_min": latency_by_period(soak.stats.latencies, LATENCY_PERIOD_S),
        "cpu": cpu_model(), "commit": git_state().get("commit"),
    }  # fmt: skip
    for name, value in sorted(growths.items(), key=lambda kv: -abs(kv[1]))[:12]:
        print(f"{name:32} {100 * value:+7.2f}% over the last {span_s / 60:.0f} min")
    for name, change in summary["at_rest"].items():
        if isinstance(change, dict):
            (was, now), (rss_was, rss_now) = change["fds"], change["rss_mib"]
            print(f"at rest {name:24} fds {was:4} -> {now:4}  RSS {rss_was:7.1f} -> {rss_now:7.1f} MiB  "
                  f"{change['fd_changes']['counts'] or ''} {change['fd_changes']['files'] or ''}")  # fmt: skip
        else:
            print(f"at rest {name:24} {change[0]} -> {change[1]}")
    print(f"failures: {failures or 'none'}")
    print(f"latency p50 by {LATENCY_PERIOD_S / 60:.0f} min (s): {summary['latency_p50_s_by_5_min']}")
    print(json.dumps(summary))
    if args.plot:
        plot(
            samples,
            args.plot,
            f"soak: {args.duration_s / 60:.0f} min at {args.load:.0%} of {capacity:.1f} req/s ({cpu_model()})",
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(json.dumps(summary) + "\n")


def latency_by_period(latencies: list[tuple[float, float]], period_s: float) -> list[float | None]:
    """The median latency (s) of the requests sent in each period of the soak, in order (None: none sent then):
    whether the platform slows down as it runs (latencies: (sent at, seconds))."""
    if not latencies:
        return []
    start = latencies[0][0]
    periods: dict[int, list[float]] = {}
    for sent_at, seconds in latencies:
        periods.setdefault(int((sent_at - start) // period_s), []).append(seconds)
    return [
        round(statistics.median(periods[i]), 3) if i in periods else None for i in range(max(periods) + 1)
    ]


def replot(samples_path: Path, plot_path: Path, title: str) -> None:
    """Plot a run's samples again (--samples file) without running it."""
    lines = [json.loads(line) for line in samples_path.read_text().splitlines() if line]
    plot([sample for sample in lines if "at_rest" not in sample], plot_path, title)


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on the way out (its `with`)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--load", type=float, default=0.7, help="fraction of the measured capacity")
    p.add_argument("--calibrate-s", type=float, default=40.0)
    p.add_argument("--calibrate-clients", type=int, default=12)
    p.add_argument("--num-tenants", type=int, default=4)
    p.add_argument("--num-adapters", type=int, default=100)
    p.add_argument(
        "--churn-s", type=float, default=15.0, help="seconds between adapter uploads (and deletes)"
    )
    p.add_argument("--reads-s", type=float, default=4.0, help="seconds between console pages / reports")
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument(
        "--settle-s",
        type=float,
        default=15.0,
        help="seconds without traffic before each sample at rest (past every keep-alive: 5 s)",
    )
    p.add_argument("--window-n", type=int, default=6, help="samples whose median starts and ends the span")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", default="tiny")
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None, help="append the summary JSON line here")
    p.add_argument("--samples", type=Path, default=None, help="append every sample here (JSON lines)")
    p.add_argument("--plot", type=Path, default=None, help="PNG of every sampled series")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
