"""The console's browser tests run Debian's Chromium (package `chromium`, installed by scripts/setup.sh) under
Playwright against a real `lorahost serve`. Browsers are never downloaded: Playwright is pointed at the system
one (LORAHOST_CHROMIUM, else /usr/bin/chromium)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from lorahost.demo import free_port, setup_tenant, wait_ready

ADMIN_KEY = "browser-admin-key"


def chromium_path() -> str:
    """The system Chromium, or a skip (a failure under CI, where scripts/setup.sh installs it)."""
    path = os.environ.get("LORAHOST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        message = (
            "Debian's chromium is not installed (scripts/setup.sh installs it: apt-get install chromium)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@dataclass(frozen=True)
class Served:
    """A running `lorahost serve` and two tenants on it."""

    url: str
    tenant_a: tuple[str, str]  # (tenant id, key)
    tenant_b: tuple[str, str]

    def tenant_name(self, tenant_id: str) -> str:
        """A tenant's name (through the admin API)."""
        tenants = httpx.get(f"{self.url}/v1/admin/tenants", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        return next(t["name"] for t in tenants.json()["data"] if t["id"] == tenant_id)


def serve(data_dir: Path, base_model_dir: Path, log_path: Path) -> Iterator[Served]:
    """Start `lorahost serve` on a free port (the tiny model), create two tenants, stop it afterwards."""
    port = free_port()
    env = {**os.environ, "LORAHOST_ADMIN_KEY": ADMIN_KEY}
    cmd = [sys.executable, "-m", "lorahost.cli", "serve", "--port", str(port), "--data-dir", str(data_dir),
           "--base-model", str(base_model_dir)]  # fmt: skip
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=180)
        yield Served(url, setup_tenant(url, ADMIN_KEY), setup_tenant(url, ADMIN_KEY))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
