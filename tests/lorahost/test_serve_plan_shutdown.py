"""SIGTERM of `lorahost serve` while a capacity plan runs (issue 33 item 1): the server exits, and the plan's
child process with it (the old synchronous plan kept the server up past 20 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from lorahost.demo import free_port, wait_ready

pytestmark = pytest.mark.slow  # starts a lorahost serve subprocess

ADMIN_KEY = "plan-shutdown-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
WAIT_S = 120.0  # generous bound on the exit (the embedded worker stops too)
SLOW_PLAN = {
    "num_samples": 2000,
    "check_s": 600.0,  # minutes of twin runs
    "workload": {"prompt_tokens": {"p50": 100}, "output_tokens": {"p50": 20},
                 "adapters": [{"name": "a", "rank": 8, "rate": 2.0}]},
}  # fmt: skip


def _serve(data_dir: Path, port: int, base_model_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "lorahost.cli", "serve", "--port", str(port), "--data-dir", str(data_dir),
           "--base-model", str(base_model_dir)]  # fmt: skip
    env = {**os.environ, "LORAHOST_ADMIN_KEY": ADMIN_KEY}
    return subprocess.Popen(cmd, env=env, stdout=log_path.open("ab"), stderr=subprocess.STDOUT)


def _plan_children(server_pid: int) -> list[psutil.Process]:
    """The server's child processes running a plan (multiprocessing's spawn children); a child that exits while
    it is looked at (a zombie not yet reaped, or gone) is not one."""
    found = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if "multiprocessing" in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    return found


def test_sigterm_stops_serve_and_its_running_plan(tmp_path: Path, base_model_dir: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    proc = _serve(tmp_path / "data", port, base_model_dir, log_path)
    try:
        wait_ready(url, proc)
        job = httpx.post(f"{url}/v1/admin/plan", json=SLOW_PLAN, headers=ADMIN, timeout=30).json()
        deadline = time.monotonic() + WAIT_S
        while not (children := _plan_children(proc.pid)):
            assert time.monotonic() < deadline, f"no plan process: {job}\n{log_path.read_text()}"
            time.sleep(0.1)
        status = httpx.get(f"{url}/v1/admin/plan/{job['id']}", headers=ADMIN, timeout=30).json()["status"]
        assert status == "running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) is not None
        _gone, alive = psutil.wait_procs(children, timeout=WAIT_S)
        assert alive == [], f"plan processes left: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
