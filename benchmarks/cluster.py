"""Cluster benchmark on `lorahost dev-cluster`: placement x routing, and a demand step with the process scaler.

    python benchmarks/cluster.py [--size small] [--num-workers 3] [--num-adapters 24] [--rps 1,2,3]
        [--placements random,contiguous,loraserve] [--routers placement_weighted,rank_aware] [--skip-step]

1. For every (placement, router) pair a fresh dev-cluster (2 API replicas, N workers, Celery worker + beat,
   PostgreSQL, Redis, a moto S3 server) serves the same workload: adapters of ranks 8..128 uploaded over REST,
   Zipf(alpha) popularity, prompt/output lengths from the Azure conversation trace, open-loop Poisson arrivals
   spread over both API replicas. A warm-up phase builds the usage history the placement job forecasts from;
   then one phase per rate. Per phase: TTFT p50/p95/p99, SLO attainment, errors; per pair: the highest rate
   whose P95 TTFT is within the SLO with no error ("max RPS within the SLO").
   Placements (LORAHOST_PLACEMENT_POLICY): random and contiguous (one holder per adapter) vs LoRAServe's
   rank-bucketed fractional placement. Routers (LORAHOST_ROUTER_POLICY): placement_weighted (LoRAServe's
   weighted random draw, blind to load) vs rank_aware (CaraServe's cost with each worker's profiled model).
2. The demand step (scaler on, starting from 0 workers): the first request waits for a scale-up from zero
   (its TTFT), then an overload phase, then idle until the workers are scaled back to zero, then one request
   again from zero; the live and desired worker counts are sampled every second.
Each result is one JSON line on stdout (and appended to --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from cluster_load import (
    admin_get,
    phase_metrics,
    placement_summary,
    replay,
    upload_ready,
    wait_placement,
)
from model_dirs import ensure_model
from run_info import cpu_model, git_state
from serving_workload import build_workload
from workload_args import add_workload_args, workload_spec

from lorahost.demo import setup_tenant
from lorahost.dev_cluster import DevCluster
from lorahost.dev_cluster_config import DevClusterConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="small", help="demo model size (tiny | small)")
    p.add_argument(
        "--model-dir", type=Path, default=None, help="dir with base/ and adapters/ (default: generated)"
    )
    p.add_argument("--num-adapters", type=int, default=24)
    p.add_argument("--num-workers", type=int, default=3)
    p.add_argument("--placements", default="random,contiguous,loraserve")
    p.add_argument("--routers", default="placement_weighted,rank_aware")
    p.add_argument("--rps", default="1,2,3", help="comma list of request rates, one phase each")
    p.add_argument("--phase-s", type=float, default=20.0, help="arrival window of each phase")
    p.add_argument("--warmup-s", type=float, default=15.0, help="arrival window of the warm-up phase")
    p.add_argument("--warmup-rps", type=float, default=1.0)
    p.add_argument(
        "--slo-ttft-ms", type=float, default=2000.0, help="P95 TTFT SLO of 'max RPS within the SLO'"
    )
    p.add_argument("--engine-threads", type=int, default=1, help="torch threads per worker")
    p.add_argument(
        "--worker-tokens-per-s", type=float, default=400.0, help="capacity model (placement, scaling)"
    )
    p.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    p.add_argument("--drain-s", type=float, default=90.0, help="after a phase's last arrival")
    p.add_argument("--no-profile", action="store_true", help="rank_aware without a profiled model (defaults)")
    p.add_argument(
        "--pin-workers",
        action="store_true",
        help="pin worker i (all its threads) to core i mod cores, so each worker has its own compute (with "
        "workers <= cores: an overloaded worker cannot borrow an idle one's core, as on separate machines)",
    )
    p.add_argument("--skip-step", action="store_true", help="skip the demand step with the scaler")
    p.add_argument("--only-step", action="store_true", help="only the demand step")
    p.add_argument("--step-rps", type=float, default=4.0, help="overload rate of the demand step")
    p.add_argument("--step-s", type=float, default=30.0, help="overload window of the demand step")
    p.add_argument("--step-max-workers", type=int, default=3)
    p.add_argument("--idle-s", type=float, default=20.0, help="scale_to_zero_idle_s of the demand step")
    p.add_argument(
        "--redis-url", default=os.environ.get("LORAHOST_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    p.add_argument("--num-requests", type=int, default=100000, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "results" / "cluster.jsonl")
    add_workload_args(p, max_prompt_tokens=256, max_output_tokens=32, length_scale=0.25)
    return p.parse_args(argv)


def emit(line: dict[str, Any], out: Path) -> None:
    """One JSON result line to stdout and the results file."""
    text = json.dumps(line, sort_keys=True)
    print(text, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(text + "\n")


def run_profile(base_dir: Path, work_dir: Path, threads: int) -> Path:
    """`lorahost profile` once for this host and base model; the workers publish it (rank_aware's model)."""
    out = work_dir / "profile.json"
    env = {
        **os.environ,
        "LORAHOST_ENGINE_NUM_THREADS": str(threads),
        "LORAHOST_BASE_MODEL_PATH": str(base_dir),
    }
    cmd = [sys.executable, "-m", "lorahost.cli", "profile", "--output", str(out), "--base-model", str(base_dir),
           "--work-dir", str(work_dir / "profile")]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=str(REPO), env=env, stdout=sys.stderr)
    return out


def cluster_env(args: argparse.Namespace, profile: Path | None, **overrides: str) -> dict[str, str]:
    """Settings every child of a benchmark cluster gets (placement runs often; small histories)."""
    env = {
        "LORAHOST_ENGINE_NUM_THREADS": str(args.engine_threads),
        "LORAHOST_PLACEMENT_INTERVAL_S": "3",
        "LORAHOST_PLACEMENT_BUCKET_S": "5",
        "LORAHOST_PLACEMENT_HISTORY_BUCKETS": "6",
        "LORAHOST_ROUTING_TABLE_REFRESH_S": "1",
        "LORAHOST_WORKER_TOKENS_PER_S": str(args.worker_tokens_per_s),
        "LORAHOST_COLD_START_TIMEOUT_S": "240",
        "LORAHOST_USAGE_CHECKPOINT_INTERVAL_S": "1",
    }
    if profile is not None:
        env["LORAHOST_WORKER_PROFILE_PATH"] = str(profile)
    return env | overrides


def adapter_dirs(model_dir: Path, num_adapters: int) -> dict[str, Path]:
    """name -> PEFT folder of the first `num_adapters` adapters."""
    dirs = sorted(p for p in (model_dir / "adapters").iterdir() if (p / "adapter_config.json").exists())
    return {p.name: p for p in dirs[:num_adapters]}


def run_phase(cluster: DevCluster, key: str, args: argparse.Namespace, base_dir: Path, names: tuple[str, ...],
              rps: float, window_s: float, seed: int) -> dict[str, Any]:  # fmt: skip
    """One open-loop phase at `rps` for `window_s` seconds of arrivals; its metrics."""
    phase_args = argparse.Namespace(**{**vars(args), "seed": seed})  # the same requests for every system
    spec = workload_spec(phase_args, trace_path=args.trace, tokenizer_dir=base_dir, adapters=names, rps=rps,
                         duration_s=window_s)  # fmt: skip
    reqs = build_workload(spec)
    before = worker_requests(cluster)
    records, elapsed = asyncio.run(replay(cluster.api_urls, key, reqs, args.timeout_s, args.drain_s))
    after = worker_requests(cluster)
    per_worker = {w: n - before.get(w, 0) for w, n in after.items()}
    mean = sum(per_worker.values()) / len(per_worker) if per_worker else 0.0
    return {
        "rps": rps,
        **phase_metrics(records, elapsed, args.slo_ttft_ms),
        "worker_requests": per_worker,
        "worker_requests_max_over_mean": round(max(per_worker.values()) / mean, 3) if mean else None,
    }


def worker_requests(cluster: DevCluster) -> dict[str, int]:
    """Requests each live worker has admitted so far (its cache hits + misses, from its /stats)."""
    headers = {"Authorization": f"Bearer {cluster.internal_token}"}
    counts = {}
    for worker in cluster.workers:
        try:
            stats = httpx.get(f"{worker.url}/internal/v1/stats", headers=headers, timeout=10).json()
        except (httpx.HTTPError, ValueError):
            continue
        counts[worker.worker_id] = int(stats.get("num_cache_hits", 0)) + int(stats.get("num_cache_misses", 0))
    return counts


def run_pair(args: argparse.Namespace, placement: str, router: str, model_dir: Path, profile: Path | None,
             work_dir: Path) -> dict[str, Any]:  # fmt: skip
    """One fresh cluster with (placement, router): warm-up, then a phase per rate."""
    env = cluster_env(args, profile, LORAHOST_PLACEMENT_POLICY=placement, LORAHOST_ROUTER_POLICY=router)
    config = DevClusterConfig(data_dir=work_dir / f"{placement}-{router}", base_model=model_dir / "base",
                              num_workers=args.num_workers, redis_url=args.redis_url, env=env)  # fmt: skip
    adapters = adapter_dirs(model_dir, args.num_adapters)
    started = time.monotonic()
    with DevCluster(config) as cluster:
        if args.pin_workers:
            pin_workers(cluster)
        _, key = setup_tenant(cluster.api_url, cluster.admin_key)
        ranks = {name: upload_ready(cluster.api_url, key, name, path) for name, path in adapters.items()}
        names = tuple(ranks)
        base_dir = model_dir / "base"
        before = admin_get(cluster.api_url, cluster.admin_key, "/v1/admin/placement").get("version") or 0
        warmup = run_phase(
            cluster, key, args, base_dir, names, args.warmup_rps, args.warmup_s, args.seed + 100
        )
        # a placement computed after the warm-up's usage rows are in (two job runs later)
        view = wait_placement(cluster.api_url, cluster.admin_key, before + 2, timeout_s=30)
        phases = [
            run_phase(cluster, key, args, base_dir, names, rps, args.phase_s, args.seed + i)
            for i, rps in enumerate(parse_floats(args.rps))
        ]
        final = admin_get(cluster.api_url, cluster.admin_key, "/v1/admin/placement")
    within = [p["rps"] for p in phases if p["ttft_ms_p95"] is not None and p["ttft_ms_p95"] <= args.slo_ttft_ms
              and not p["errors"]]  # fmt: skip
    return {
        "system": "cluster",
        "placement": placement,
        "router": router,
        "num_workers": args.num_workers,
        "is_pinned": args.pin_workers,
        "ranks": sorted(set(ranks.values())),
        "warmup": warmup,
        "placement_after_warmup": placement_summary(view),
        "placement_final": placement_summary(final),
        "phases": phases,
        "max_rps_within_slo": max(within) if within else 0.0,
        "slo_ttft_ms": args.slo_ttft_ms,
        "wall_s": round(time.monotonic() - started, 1),
    }


def pin_workers(cluster: DevCluster) -> None:
    """Worker i's threads on core i mod cores (taskset -a; its later threads inherit it)."""
    cores = sorted(os.sched_getaffinity(0))
    for i, worker in enumerate(cluster.workers):
        core = cores[i % len(cores)]
        subprocess.run(["taskset", "-a", "-cp", str(core), str(worker.process.pid)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip


class WorkerSampler:
    """Live and desired workers once a second, in a thread, while the demand step runs."""

    def __init__(self, cluster: DevCluster, base_model: str) -> None:
        self.cluster = cluster
        self.base_model = base_model
        self.samples: list[tuple[float, int, int | None]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> WorkerSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def now(self) -> float:
        """Seconds since the sampler started."""
        return time.monotonic() - self._t0

    def live(self) -> int:
        """The last sampled live worker count."""
        return self.samples[-1][1] if self.samples else 0

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                desired = admin_get(self.cluster.api_url, self.cluster.admin_key,
                                    f"/v1/admin/scaling?base_model={self.base_model}")["desired_workers"]  # fmt: skip
            except Exception:  # noqa: BLE001 - a sample is best effort
                desired = None
            self.samples.append((round(self.now(), 1), len(self.cluster.live_worker_ids()), desired))


def run_step(
    args: argparse.Namespace, model_dir: Path, profile: Path | None, work_dir: Path
) -> dict[str, Any]:
    """Scale from zero, overload, back to zero, and from zero again, with the process scaler on."""
    env = cluster_env(args, profile, LORAHOST_ROUTER_POLICY="rank_aware",
                      LORAHOST_SCALE_TO_ZERO_IDLE_S=str(args.idle_s),
                      LORAHOST_SCALE_DOWN_COOLDOWN_S=str(args.idle_s),
                      LORAHOST_SCALING_MAX_WORKERS=str(args.step_max_workers))  # fmt: skip
    config = DevClusterConfig(data_dir=work_dir / "step", base_model=model_dir / "base", num_workers=0,
                              redis_url=args.redis_url, env=env, is_autoscale=True,
                              max_workers=args.step_max_workers, scaler_interval_s=1.0)  # fmt: skip
    adapters = adapter_dirs(model_dir, args.num_adapters)
    base_dir = model_dir / "base"
    with DevCluster(config) as cluster:
        _, key = setup_tenant(cluster.api_url, cluster.admin_key)
        names = tuple(
            name for name, path in adapters.items() if upload_ready(cluster.api_url, key, name, path) >= 0
        )
        base_model = config.base_model_name
        sampler = WorkerSampler(cluster, base_model).start()
        try:
            first = run_phase(cluster, key, args, base_dir, names[:1], 0.2, 1.0, args.seed + 200)
            t_overload = sampler.now()
            overload = run_phase(
                cluster, key, args, base_dir, names, args.step_rps, args.step_s, args.seed + 201
            )
            t_idle = sampler.now()
            deadline = time.monotonic() + 3 * args.idle_s + 60
            while time.monotonic() < deadline and (sampler.live() > 0 or sampler.now() - t_idle < 5):
                time.sleep(1.0)
            t_zero = sampler.now() if sampler.live() == 0 else None
            again = run_phase(cluster, key, args, base_dir, names[:1], 0.2, 1.0, args.seed + 202)
        finally:
            sampler.stop()
    return {
        "system": "cluster_step",
        "first_request_from_zero": first,
        "overload": overload,
        "request_after_scale_to_zero": again,
        "t_overload_start_s": round(t_overload, 1),
        "t_idle_start_s": round(t_idle, 1),
        "t_back_to_zero_s": None if t_zero is None else round(t_zero, 1),
        "max_live_workers": max((s[1] for s in sampler.samples), default=0),
        "workers_over_time": sampler.samples,
        "step_rps": args.step_rps,
        "idle_s": args.idle_s,
    }


def _fit_of(profile: Path | None) -> dict[str, Any] | None:
    """The fitted model of a profile file, without its raw samples."""
    if profile is None:
        return None
    return {k: v for k, v in json.loads(profile.read_text()).items() if k != "samples"}


def parse_floats(text: str) -> list[float]:
    """'1,2,3' -> [1.0, 2.0, 3.0]."""
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model_dir = args.model_dir or Path(
        os.path.expanduser(f"~/.cache/lorahost/bench-{args.size}-{args.num_adapters}")
    )
    ensure_model(model_dir, sys.executable, args.num_adapters, args.size)
    with tempfile.TemporaryDirectory(prefix="lorahost-cluster-bench-") as tmp:
        work_dir = Path(tmp)
        profile = None if args.no_profile else run_profile(model_dir / "base", work_dir, args.engine_threads)
        emit({"system": "setup", "model_dir": str(model_dir), "cpu": cpu_model(), "git": git_state(),
              "cores": os.cpu_count(), "profile": _fit_of(profile),
              "args": {k: str(v) for k, v in vars(args).items()}}, args.out)  # fmt: skip
        if not args.only_step:
            for placement in args.placements.split(","):
                for router in args.routers.split(","):
                    emit(run_pair(args, placement, router, model_dir, profile, work_dir), args.out)
        if not args.skip_step:
            emit(run_step(args, model_dir, profile, work_dir), args.out)


if __name__ == "__main__":
    main()
