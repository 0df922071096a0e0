"""Chaos on a dev-cluster (issue 38 item 1): faults injected one after another under steady traffic from two
tenants, and what the platform did about each.

    python benchmarks/chaos.py [--faults worker,api,postgres,redis] [--rate 3] [--fault-s 8] [--out FILE]

The cluster: 2 API replicas, 2 workers, Celery, PostgreSQL reached through a fault proxy (benchmarks/
fault_proxy.py), a Redis server of its own (it can be stopped and started empty), a moto S3 server; the tiny demo
model, one adapter per tenant. Traffic: open-loop arrivals at --rate per second, tenants and models (adapter or
base) in turn, half of them streamed, spread over the API replicas a load balancer would send to (a killed replica
leaves the rotation until it is back, as a health check would have it).

Faults, each after a quiet --settle-s:
- worker: kill -9 of a worker with streams on it, restarted under the same id once the router dropped it;
- api: kill -9 of an API replica with streams on it, restarted under the same api_instance_id (it writes what it
  spooled, then closes what it left open as interrupted);
- postgres: every PostgreSQL connection reset and new ones refused for --fault-s (a restart or failover);
- redis: redis-server stopped for --fault-s, then started empty;
- s3: every connection to the S3 server (moto, behind a fault proxy) reset and new ones refused for --fault-s;
  an upload is tried during it (it must answer 503 and keep nothing) and again after (it must succeed);
- jobs: kill -9 of the Celery job runner in the middle of a validation (S3 slowed while the upload's job runs,
  so the kill lands mid-job), then restarted: the task is delivered again after --visibility-s and the version
  becomes ready (`revalidated_s`: from the kill to ready);
- link: the link between the API replicas and one worker (registered behind a fault proxy) slowed by
  --link-delay-s per chunk for --fault-s and reset in the middle; `link_connections_open` after it is what the
  proxy still carries (the API's pooled connections; an orphan would show as more than twice the API's).

Per fault, one table row: requests whose life overlapped the fault's window (from the injection to the end of the
fault), by outcome: completed, ended with a clear error (an SSE error event, or a JSON error), broken connections
(only a killed API's own streams are expected to), 5xx answers; 5xx among the requests that started after the
window ("outside"); recovery_s, from the end of the fault to the end of the last request that failed between this injection
and the next. After the last fault the usage ledger is checked against what every client received: rows
per request (billed twice), tokens billed beyond or short of what was delivered, and rows still `in_progress`
after the lease timeout plus a sweep (stuck). One JSON line per fault and one for the ledger; --out appends them.
Not a test: timings depend on the machine (its CPU is printed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from cluster_load import upload_ready
from fault_proxy import FaultProxy
from local_redis import LocalRedis
from model_dirs import ensure_model
from run_info import cpu_model, git_state
from sqlalchemy import func, make_url, select

from lorahost.demo import setup_tenant
from lorahost.dev_cluster import DevCluster
from lorahost.dev_cluster_config import DevClusterConfig
from lorahost.dev_services import DEFAULT_POSTGRES_ADMIN_URL, MOTO_CREDENTIALS, start_moto
from lorahost.processes import free_port
from registry.db import make_engine, make_session_factory
from registry.models import UsageRecord

FAULTS = ("worker", "api", "postgres", "redis", "s3", "jobs", "link")
REQUEST_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    """What one client sent and received."""

    tenant: int
    model: str
    is_stream: bool
    api_index: int
    started_at: float
    ended_at: float | None = None
    status_code: int | None = None
    response_id: str | None = None
    num_delivered: int = 0  # completion tokens the client received (token chunks, or the JSON usage)
    first_token_at: float | None = None  # streams: when the first token chunk arrived
    is_done: bool = False
    error_type: str | None = None  # the error the API sent (SSE error event or JSON body)
    transport_error: str | None = None  # the connection broke

    @property
    def is_ok(self) -> bool:
        return (
            self.status_code == 200
            and self.error_type is None
            and self.transport_error is None
            and (self.is_done or not self.is_stream)
        )

    @property
    def request_id(self) -> str | None:
        return None if self.response_id is None else "req-" + self.response_id.split("-", 1)[1]


def send(api_url: str, key: str, out: Outcome, max_tokens: int, seed: int) -> None:
    """One completion, recorded into `out` as it arrives; never raises."""
    body: dict[str, Any] = {"model": out.model, "prompt": f"chaos request {seed}", "max_tokens": max_tokens,
                            "ignore_eos": True, "temperature": 1.0, "seed": seed, "stream": out.is_stream}  # fmt: skip
    if out.is_stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with httpx.Client(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=5)) as http:
            if out.is_stream:
                with http.stream("POST", f"{api_url}/v1/completions", json=body, headers=headers) as response:
                    out.status_code = response.status_code
                    if response.status_code != 200:
                        out.error_type = _error_type(response.read())
                        return
                    for line in response.iter_lines():
                        _on_sse_line(line, out)
            else:
                response = http.post(f"{api_url}/v1/completions", json=body, headers=headers)
                out.status_code = response.status_code
                if response.status_code != 200:
                    out.error_type = _error_type(response.content)
                    return
                payload = response.json()
                out.response_id, out.num_delivered = payload["id"], payload["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        out.transport_error = type(exc).__name__
    finally:
        out.ended_at = time.time()


def _error_type(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["type"])
    except (ValueError, KeyError, TypeError):
        return "unparsable"


def _on_sse_line(line: str, out: Outcome) -> None:
    if not line.startswith("data: "):
        return
    payload = line[len("data: ") :]
    if payload == "[DONE]":
        out.is_done = True
        return
    chunk = json.loads(payload)
    if "error" in chunk:
        out.error_type = str(chunk["error"].get("type"))
        return
    out.response_id = out.response_id or chunk.get("id")
    for choice in chunk.get("choices", []):
        if choice.get("finish_reason") is None:
            out.num_delivered += 1
            out.first_token_at = out.first_token_at or time.time()


@dataclass
class Traffic:
    """Open-loop arrivals at `rate` per second until stopped, over the API replicas in `live_apis`."""

    cluster: DevCluster
    keys: list[str]
    models: list[list[str]]  # per tenant: the models it calls in turn
    rate: float
    max_tokens: int
    outcomes: list[Outcome] = field(default_factory=list)
    live_apis: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.live_apis = set(range(len(self.cluster.apis)))
        self._threads.append(threading.Thread(target=self._run, daemon=True))
        self._threads[0].start()

    def stop(self) -> list[Outcome]:
        self._stop.set()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S + 30
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.outcomes

    def num_in_flight(self) -> int:
        return sum(o.ended_at is None for o in self.outcomes)

    def _run(self) -> None:
        counter = itertools.count()
        next_at = time.monotonic()
        while not self._stop.is_set():
            n = next(counter)
            tenant = n % len(self.keys)
            models = self.models[tenant]
            apis = sorted(self.live_apis)
            api_index = apis[n % len(apis)]
            out = Outcome(tenant, models[(n // 2) % len(models)], n % 4 < 2, api_index, time.time())
            self.outcomes.append(out)
            url = self.cluster.apis[api_index].url or ""
            max_tokens = self.max_tokens if out.is_stream else max(4, self.max_tokens // 4)
            thread = threading.Thread(
                target=send, args=(url, self.keys[tenant], out, max_tokens, n), daemon=True
            )
            thread.start()
            self._threads.append(thread)
            next_at += 1.0 / self.rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))


@dataclass
class Window:
    """One fault: when it was injected and when it ended (the fault itself, not the platform's recovery)."""

    fault: str
    injected_at: float
    ended_at: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Faults:
    """What the run can break: PostgreSQL's and S3's links, its own Redis, and an adapter to upload meanwhile."""

    postgres: FaultProxy
    s3: FaultProxy
    redis: LocalRedis
    link: FaultProxy  # in front of one worker
    key: str
    adapter_dir: Path
    link_delay_s: float = 0.05


def try_upload(api_url: str, key: str, name: str, adapter_dir: Path) -> int:
    """The status of one adapter upload."""
    files = [
        ("files", (n, (adapter_dir / n).read_bytes()))
        for n in ("adapter_config.json", "adapter_model.safetensors")
    ]
    headers = {"Authorization": f"Bearer {key}"}
    try:
        return httpx.post(
            f"{api_url}/v1/adapters", headers=headers, data={"name": name}, files=files, timeout=60
        ).status_code
    except httpx.HTTPError:
        return 0


def inject(fault: str, cluster: DevCluster, traffic: Traffic, faults: Faults, fault_s: float) -> Window:
    """Inject one fault under the running traffic and end it; returns its window."""
    wait_streams(traffic, api_index=1 if fault == "api" else None)
    detail: dict[str, Any] = {}
    victim = streaming_worker(cluster) if fault == "worker" else None
    injected_at = time.time()
    if fault == "worker":
        handle = cluster.kill_worker(victim or 0)
        detail["worker"] = handle.worker_id
        started = time.monotonic()
        cluster.wait_live_workers(lambda ids: handle.worker_id not in ids, timeout_s=60)
        detail["router_dropped_s"] = round(time.monotonic() - started, 2)
        ended_at = time.time()
        cluster.start_worker(worker_id=handle.worker_id)
    elif fault == "api":
        traffic.live_apis.discard(1)  # the load balancer's health check
        cluster.kill_api(1)
        ended_at = time.time()
        started = time.monotonic()
        cluster.restart_api(1)
        detail["restart_s"] = round(time.monotonic() - started, 2)
        traffic.live_apis.add(1)
    elif fault == "postgres":
        faults.postgres.cut()
        time.sleep(fault_s)
        faults.postgres.restore()
        ended_at = time.time()
    elif fault == "redis":
        faults.redis.stop()
        time.sleep(fault_s)
        faults.redis.start()
        ended_at = time.time()
    elif fault == "s3":
        faults.s3.cut()
        deadline = time.monotonic() + fault_s
        detail["upload_during"] = try_upload(
            cluster.api_url, faults.key, "during-s3-outage", faults.adapter_dir
        )
        time.sleep(max(0.0, deadline - time.monotonic()))
        faults.s3.restore()
        ended_at = time.time()
        detail["upload_after"] = try_upload(
            cluster.api_url, faults.key, "during-s3-outage", faults.adapter_dir
        )
    elif fault == "jobs":
        ended_at = kill_jobs_mid_validation(cluster, faults, detail)
    elif fault == "link":
        faults.link.delay_s = faults.link_delay_s
        time.sleep(fault_s / 2)
        faults.link.cut()  # a reset in the middle of the slow spell
        faults.link.restore()
        time.sleep(fault_s / 2)
        faults.link.delay_s = 0.0
        ended_at = time.time()
        time.sleep(6.0)  # idle pooled connections expire (5 s keep-alive)
        detail["link_connections_open"] = faults.link.num_open()
    else:
        raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
    return Window(fault, injected_at, ended_at, detail)


def num_received(cluster: DevCluster) -> int:
    """Validation tasks the running job runner's log says it received."""
    jobs = cluster.jobs
    return 0 if jobs is None else jobs.log_tail(max_chars=1 << 22).count("validate_adapter_version[")


def kill_jobs_mid_validation(cluster: DevCluster, faults: Faults, detail: dict[str, Any]) -> float:
    """Upload with S3 slowed, kill -9 the job runner once it took the job, restart it, wait for ready; the time
    the fault ended (the restart)."""
    before = num_received(cluster)
    faults.s3.delay_s = 0.3
    name = f"jobs-kill-{int(time.time())}"
    upload = threading.Thread(target=try_upload, args=(cluster.api_url, faults.key, name, faults.adapter_dir))
    upload.start()
    deadline = time.monotonic() + 60
    while num_received(cluster) <= before and time.monotonic() < deadline:
        time.sleep(0.02)
    killed_at = time.monotonic()
    cluster.kill_jobs()
    faults.s3.delay_s = 0.0
    upload.join()
    cluster.restart_jobs()
    ended_at = time.time()
    headers = {"Authorization": f"Bearer {faults.key}"}
    status = "validating"
    while status == "validating" and time.monotonic() < killed_at + 300:
        versions = httpx.get(
            f"{cluster.api_url}/v1/adapters/{name}/versions", headers=headers, timeout=10
        ).json()
        status = versions["data"][0]["status"] if versions.get("data") else "missing"
        time.sleep(0.2)
    detail["version_status"] = status
    detail["revalidated_s"] = round(time.monotonic() - killed_at, 2)
    return ended_at


def wait_streams(traffic: Traffic, api_index: int | None = None, timeout_s: float = 30.0) -> None:
    """Until streams that got tokens are in flight (through API replica `api_index`, or any): a fault must meet
    work in progress."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        flowing = [o for o in traffic.outcomes if o.is_stream and o.ended_at is None and o.num_delivered > 0]
        if len([o for o in flowing if api_index in (None, o.api_index)]) >= (
            1 if api_index is not None else 2
        ):
            return
        time.sleep(0.02)


def streaming_worker(cluster: DevCluster) -> str | None:
    """The worker with the most streams in flight that checkpointed a token (from the usage ledger)."""
    engine = make_engine(cluster.database_url or "")
    try:
        with engine.connect() as conn:
            query = (
                select(UsageRecord.worker_id, func.count())
                .where(UsageRecord.status == "in_progress", UsageRecord.completion_tokens > 0)
                .group_by(UsageRecord.worker_id)
                .order_by(func.count().desc())
            )
            row = conn.execute(query).first()
    finally:
        engine.dispose()
    return None if row is None else row[0]


def window_row(window: Window, outcomes: list[Outcome], next_injected_at: float) -> dict[str, Any]:
    """The table row of one fault."""
    during = [
        o for o in outcomes if o.started_at <= window.ended_at and (o.ended_at or 1e18) >= window.injected_at
    ]
    after = [o for o in outcomes if window.ended_at < o.started_at < next_injected_at]
    failed = [
        o for o in outcomes if not o.is_ok and window.injected_at <= (o.ended_at or 0.0) < next_injected_at
    ]
    last_failure = max((o.ended_at or 0.0 for o in failed), default=window.ended_at)
    return {
        "fault": window.fault,
        "window_s": round(window.ended_at - window.injected_at, 2),
        "num_requests": len(during),
        "num_ok": sum(o.is_ok for o in during),
        "num_clear_errors": sum(o.error_type is not None for o in during),
        "num_broken": sum(o.transport_error is not None for o in during),
        "num_5xx": sum((o.status_code or 0) >= 500 for o in during),
        "error_types": sorted({o.error_type for o in during if o.error_type}),
        "num_5xx_outside": sum((o.status_code or 0) >= 500 or o.error_type is not None for o in after),
        "num_after": len(after),
        "recovery_s": round(max(0.0, last_failure - window.ended_at), 2),
        **window.detail,
    }


def ledger_row(database_url: str, tenant_ids: list[str], outcomes: list[Outcome]) -> dict[str, Any]:
    """Every client's delivered tokens against the usage ledger."""
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            rows = session.execute(
                select(UsageRecord.request_id, UsageRecord.status, UsageRecord.completion_tokens).where(
                    UsageRecord.tenant_id.in_(tenant_ids)
                )
            ).all()
            num_rows = session.scalar(select(func.count()).select_from(UsageRecord))
    finally:
        engine.dispose()
    billed: dict[str, list[int]] = {}
    for request_id, _, tokens in rows:
        billed.setdefault(request_id, []).append(tokens)
    over = under = num_missing = 0
    unbilled_s: list[float] = []
    for o in outcomes:
        if o.request_id is None:
            continue
        tokens = billed.get(o.request_id)
        if tokens is None:
            num_missing += 1
            continue
        over += max(0, sum(tokens) - o.num_delivered)
        unbilled = max(0, o.num_delivered - sum(tokens))
        under += unbilled
        if unbilled and o.first_token_at and o.ended_at and o.ended_at > o.first_token_at:
            # as time: how long the stream took to deliver what was not billed, at its own pace
            unbilled_s.append(unbilled * (o.ended_at - o.first_token_at) / o.num_delivered)
    return {
        "num_requests": len(outcomes),
        "num_rows": len(rows),
        "num_rows_all_tenants": num_rows,
        "num_billed_twice": sum(len(t) > 1 for t in billed.values()),
        "num_answered_without_row": num_missing,
        "tokens_delivered": sum(o.num_delivered for o in outcomes),
        "tokens_billed_beyond_delivered": over,
        "tokens_delivered_unbilled": under,
        "max_unbilled_s": round(max(unbilled_s, default=0.0), 2),
        "num_stuck_in_progress": sum(status == "in_progress" for _, status, _ in rows),
        "statuses": {s: sum(st == s for _, st, _ in rows) for s in sorted({st for _, st, _ in rows})},
    }


def print_ledger(ledger: dict[str, Any]) -> None:
    print(f"ledger: {ledger['num_requests']} requests, {ledger['num_rows']} usage rows, "
          f"{ledger['num_billed_twice']} billed twice, {ledger['num_answered_without_row']} answered without a row, "
          f"{ledger['tokens_delivered']} tokens delivered, {ledger['tokens_billed_beyond_delivered']} billed beyond "
          f"delivery, {ledger['tokens_delivered_unbilled']} delivered unbilled (at most {ledger['max_unbilled_s']} s of "
          f"a stream), {ledger['num_stuck_in_progress']} "
          f"stuck in progress; statuses {ledger['statuses']}")  # fmt: skip


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'fault':9} {'window s':>8} {'reqs':>5} {'ok':>4} {'clear err':>9} {'broken':>6} {'5xx':>4} "
          f"{'5xx after':>9} {'recovery s':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['fault']:9} {r['window_s']:>8.1f} {r['num_requests']:>5} {r['num_ok']:>4} "
              f"{r['num_clear_errors']:>9} {r['num_broken']:>6} {r['num_5xx']:>4} {r['num_5xx_outside']:>9} "
              f"{r['recovery_s']:>10.1f}")  # fmt: skip


def run(args: argparse.Namespace) -> None:
    model_dir = args.model_dir or Path(os.path.expanduser(f"~/.cache/lorahost/bench-{args.size}-2"))
    ensure_model(model_dir, sys.executable, 2, args.size)
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed (the chaos run stops and starts a Redis of its own)")
    admin = make_url(args.postgres_admin_url)
    proxy = FaultProxy(admin.host or "127.0.0.1", admin.port or 5432)
    work = Path(tempfile.mkdtemp(prefix="lorahost-chaos-"))
    redis_server = LocalRedis(free_port(), work)
    redis_server.start()
    for name, value in MOTO_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    moto = start_moto("127.0.0.1", work / "moto.log", 60)
    moto_port = int((moto.url or "").rsplit(":", 1)[1])
    s3_proxy = FaultProxy("127.0.0.1", moto_port)
    env = {
        "LORAHOST_ENGINE_NUM_THREADS": "1",
        "LORAHOST_USAGE_CHECKPOINT_INTERVAL_S": "0.5",
        "LORAHOST_USAGE_LEASE_TIMEOUT_S": str(args.lease_s),
        "LORAHOST_USAGE_SWEEP_INTERVAL_S": "2",
        "LORAHOST_DRAIN_TIMEOUT_S": "10",
        "LORAHOST_CELERY_VISIBILITY_TIMEOUT_S": str(args.visibility_s),
    }
    config = DevClusterConfig(
        data_dir=work / "cluster", base_model=model_dir / "base", num_api=2, num_workers=1,
        postgres_admin_url=admin.set(port=proxy.port).render_as_string(hide_password=False),
        redis_url=redis_server.url, s3_endpoint=f"http://127.0.0.1:{s3_proxy.port}", env=env, start_timeout_s=240,
    )  # fmt: skip
    cluster = DevCluster(config).start()
    link_port = free_port()
    link = FaultProxy("127.0.0.1", link_port)
    rows: list[dict[str, Any]] = []
    try:
        cluster.start_worker(port=link_port, advertise_url=f"http://127.0.0.1:{link.port}")
        api = cluster.api_url
        tenants = [setup_tenant(api, cluster.admin_key) for _ in range(2)]
        adapters = sorted((model_dir / "adapters").iterdir())
        for (_, key), adapter_dir in zip(tenants, adapters, strict=False):
            upload_ready(api, key, "chaos", adapter_dir)
        traffic = Traffic(cluster, [k for _, k in tenants], [["chaos", config.base_model_name]] * 2, args.rate,
                          args.max_tokens)  # fmt: skip
        traffic.start()
        faults = Faults(proxy, s3_proxy, redis_server, link, tenants[0][1], adapters[0], args.link_delay_s)
        windows = []
        for fault in args.faults:
            time.sleep(args.settle_s)
            windows.append(inject(fault, cluster, traffic, faults, args.fault_s))
            print(json.dumps({"injected": fault, **windows[-1].detail}), file=sys.stderr, flush=True)
        time.sleep(args.settle_s)
        outcomes = traffic.stop()
        time.sleep(args.lease_s + 6)  # a lease timeout and a sweep: anything left open is stuck
        ends = [w.injected_at for w in windows[1:]] + [time.time()]
        rows = [window_row(w, outcomes, end) for w, end in zip(windows, ends, strict=True)]
        ledger = ledger_row(cluster.database_url or "", [t for t, _ in tenants], outcomes)
    finally:
        cluster.stop()
        proxy.close()
        s3_proxy.close()
        link.close()
        moto.stop(5)
        redis_server.stop()
    print_table(rows)
    print_ledger(ledger)
    context = {"cpu": cpu_model(), "commit": git_state().get("commit"), "rate": args.rate, "fault_s": args.fault_s,
               "load_avg": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    lines = [{"bench": "chaos", **row, **context} for row in rows]
    lines.append({"bench": "chaos", "ledger": ledger, **context})
    print(json.dumps(lines[-1]))
    for line in lines[:-1]:
        print(json.dumps(line))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", type=lambda s: s.split(","), default=list(FAULTS), help=",".join(FAULTS))
    p.add_argument("--rate", type=float, default=3.0, help="requests per second")
    p.add_argument("--max-tokens", type=int, default=240, help="of a stream (a quarter for the others)")
    p.add_argument("--fault-s", type=float, default=8.0, help="how long PostgreSQL and Redis are down")
    p.add_argument("--settle-s", type=float, default=8.0, help="quiet traffic before each fault and after")
    p.add_argument("--lease-s", type=float, default=6.0, help="usage lease timeout of the cluster")
    p.add_argument("--visibility-s", type=float, default=5.0, help="Celery visibility timeout of the cluster")
    p.add_argument("--link-delay-s", type=float, default=0.05, help="the slow link's delay per chunk")
    p.add_argument("--size", default="tiny")
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--postgres-admin-url", default=DEFAULT_POSTGRES_ADMIN_URL)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    unknown = sorted(set(args.faults) - set(FAULTS))
    if unknown:
        p.error(f"unknown faults {unknown}; choose from {', '.join(FAULTS)}")
    run(args)


if __name__ == "__main__":
    main()
