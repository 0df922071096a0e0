"""Does a capacity plan slow another tenant? (issue 33 item 1)

Starts `lorahost serve` (embedded mode, the tiny demo model) from `--repo` (default this checkout; point it at
an older checkout to measure the old code), creates a tenant and measures its TTFT (a short streamed
completion) in three phases:
  idle     no plan;
  during   3 heavy plans submitted by the admin (new code: POST answers 202 and the plans run as jobs, one at
           a time in a low-priority child process; old code: POST blocks, so each client gives up after
           `--client-timeout-s` and abandons its plan, which keeps running in the API's thread pool);
  after    new code: the 3 jobs cancelled (DELETE); old code: the clients are gone, the plans are not.
Then SIGTERM and how long the server takes to exit (killed after `--exit-wait-s`).
Prints one JSON line per phase and one for the exit, each with the CPU's name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.child_process import busy_cores
from benchmarks.run_info import cpu_model

REPO = Path(__file__).resolve().parent.parent
ADMIN_KEY = "plan-isolation-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
HEAVY_PLAN = {
    "num_samples": 2000,  # twin training runs: minutes of pure-Python CPU
    "check_s": 600.0,
    "workload": {"prompt_tokens": {"p50": 100}, "output_tokens": {"p50": 20},
                 "adapters": [{"name": "a", "rank": 8, "rate": 2.0}]},
}  # fmt: skip


def start_server(repo: Path, data_dir: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """`lorahost serve` of `repo` on the tiny demo model."""
    env = {**os.environ, "PYTHONPATH": str(repo), "LORAHOST_ADMIN_KEY": ADMIN_KEY, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lorahost.cli", "serve", "--port", str(port), "--data-dir", str(data_dir)]
    return subprocess.Popen(cmd, env=env, cwd=repo, stdout=log_path.open("ab"), stderr=subprocess.STDOUT)


def ttft_s(url: str, key: str) -> float:
    """Seconds to the first token of a short streamed completion of the base model."""
    body = {"model": "lorahost-base", "prompt": "Hello", "max_tokens": 4, "stream": True}
    started = time.perf_counter()
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - started
    raise RuntimeError("the stream ended without a token")


def measure(url: str, key: str, num_requests: int, max_phase_s: float) -> list[float]:
    """TTFTs of up to num_requests sequential requests, stopping after max_phase_s."""
    deadline = time.monotonic() + max_phase_s
    values: list[float] = []
    while len(values) < num_requests and time.monotonic() < deadline:
        values.append(ttft_s(url, key))
    return values


def summary(phase: str, values: list[float], extra: dict[str, Any]) -> dict[str, Any]:
    """One result line: p50/p99/max TTFT in ms."""
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "benchmark": "plan_isolation", "phase": phase, "num_requests": len(values),
        "ttft_p50_ms": round(statistics.median(values) * 1000, 1), "ttft_p99_ms": round(p99 * 1000, 1),
        "ttft_max_ms": round(ordered[-1] * 1000, 1),
    } | extra  # fmt: skip


def submit_plans(url: str, num_plans: int, client_timeout_s: float) -> tuple[str, list[str]]:
    """Submit the plans: ("jobs", ids) when POST answers 202, else ("blocking", []) once every client gave up."""
    first = _post_plan(url, client_timeout_s)
    if first is not None:
        return "jobs", [first] + [_post_plan(url, client_timeout_s) or "" for _ in range(num_plans - 1)]
    threads = [
        threading.Thread(target=_post_plan, args=(url, client_timeout_s)) for _ in range(num_plans - 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return "blocking", []


def _post_plan(url: str, client_timeout_s: float) -> str | None:
    try:
        response = httpx.post(
            f"{url}/v1/admin/plan", json=HEAVY_PLAN, headers=ADMIN, timeout=client_timeout_s
        )
    except httpx.TimeoutException:
        return None  # the old synchronous route: the client gives up, the plan goes on
    return str(response.json()["id"]) if response.status_code == 202 else None


def stop_server(proc: subprocess.Popen[bytes], exit_wait_s: float) -> dict[str, Any]:
    """SIGTERM; seconds to exit, or killed after exit_wait_s."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=exit_wait_s)
        return {"sigterm_exit_s": round(time.monotonic() - started, 2), "is_killed": False}
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"sigterm_exit_s": None, "is_killed": True, "exit_wait_s": exit_wait_s}


def run(args: argparse.Namespace) -> None:
    from lorahost.demo import free_port, setup_tenant, wait_ready

    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="plan-isolation-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(Path(args.repo).resolve(), data_dir, port, data_dir / "serve.log")
    # the machine may be shared: cores busy with other work before the server starts, with each result
    common = {
        "repo": str(args.repo),
        "cpu": cpu_model(),
        "num_cpus": os.cpu_count(),
        "other_load_cores": round(busy_cores(), 2),
    }
    try:
        wait_ready(url, proc)
        with contextlib.redirect_stdout(sys.stderr):  # stdout holds the JSON lines only
            _, key = setup_tenant(url, ADMIN_KEY)
        measure(url, key, 3, 30.0)  # warm-up
        print(json.dumps(summary("idle", measure(url, key, args.num_requests, args.max_phase_s), common)))
        mode, job_ids = submit_plans(url, args.num_plans, args.client_timeout_s)
        during = measure(url, key, args.num_requests, args.max_phase_s)
        print(json.dumps(summary("during", during, common | {"mode": mode, "num_plans": args.num_plans})))
        for job_id in job_ids:
            httpx.delete(f"{url}/v1/admin/plan/{job_id}", headers=ADMIN, timeout=60)
        after = measure(url, key, args.num_requests, args.max_phase_s)
        print(json.dumps(summary("after", after, common | {"mode": mode, "is_cancelled": bool(job_ids)})))
    finally:
        if proc.poll() is None:
            print(
                json.dumps(
                    {"benchmark": "plan_isolation", "phase": "sigterm"}
                    | stop_server(proc, args.exit_wait_s)
                    | common
                )
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", default=str(REPO), help="checkout whose `lorahost serve` runs (PYTHONPATH)")
    parser.add_argument(
        "--data-dir", default=None, help="the server's data dir (default: a new temporary one)"
    )
    parser.add_argument("--num-requests", type=int, default=20, help="requests per phase")
    parser.add_argument("--max-phase-s", type=float, default=60.0, help="a phase stops after this long")
    parser.add_argument("--num-plans", type=int, default=3)
    parser.add_argument(
        "--client-timeout-s", type=float, default=5.0, help="old code: clients give up after this"
    )
    parser.add_argument("--exit-wait-s", type=float, default=30.0, help="SIGTERM: kill after this long")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
