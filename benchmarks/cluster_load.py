"""The client side of cluster.py: tenant and adapters over REST, an open-loop streamed replay spread over the
API replicas, per-phase metrics, and the admin views (placement, scaling, live workers) polled over time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import httpx
from serving_client import stream_completion
from serving_metrics import pct, rnd
from serving_workload import WorkloadRequest

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def upload_ready(api_url: str, key: str, name: str, adapter_dir: Path, timeout_s: float = 120.0) -> int:
    """Upload a PEFT adapter over REST, wait until the job runner validated it; returns its rank."""
    headers = {"Authorization": f"Bearer {key}"}
    files = [("files", (n, (adapter_dir / n).read_bytes())) for n in ADAPTER_FILES]
    response = httpx.post(
        f"{api_url}/v1/adapters", headers=headers, data={"name": name}, files=files, timeout=120
    )
    if response.status_code not in (201, 202):
        raise RuntimeError(f"upload of {name} failed: {response.status_code} {response.text[:300]}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = httpx.get(f"{api_url}/v1/adapters/{name}", headers=headers, timeout=10).json()
        if body.get("latest_ready_version"):
            return int(response.json()["version"].get("rank") or 0)
        time.sleep(0.3)
    raise RuntimeError(f"adapter {name} not ready after {timeout_s:g} s")


def request_body(req: WorkloadRequest) -> dict[str, Any]:
    """A streamed completion of exactly the workload's output length."""
    return {
        "model": req.adapter,
        "prompt": req.prompt,
        "max_tokens": req.output_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def replay(
    api_urls: list[str], key: str, reqs: list[WorkloadRequest], timeout_s: float, drain_s: float
) -> tuple[list[dict], float]:
    """Send every request at its arrival time (open loop), API replicas in turn; (records, elapsed s)."""
    headers = {"Authorization": f"Bearer {key}"}
    urls = itertools.cycle([f"{u}/v1/completions" for u in api_urls])
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        t0 = time.perf_counter() + 0.2

        async def one(req: WorkloadRequest, url: str) -> dict:
            delay = t0 + req.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = await stream_completion(client, url, headers, request_body(req), timeout_s)
            rec.update(index=req.index, adapter=req.adapter, arrival_s=req.arrival_s)
            return rec

        tasks = [asyncio.create_task(one(r, next(urls))) for r in reqs]
        last = reqs[-1].arrival_s if reqs else 0.0
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, t0 + last + drain_s - time.perf_counter()))
        for task in pending:
            task.cancel()
        records = [
            t.result()
            if t in done and t.exception() is None
            else {"index": r.index, "adapter": r.adapter, "ok": False, "error": "cut at the drain deadline"}
            for r, t in zip(reqs, tasks, strict=True)
        ]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    return records, time.perf_counter() - t0


def phase_metrics(records: list[dict], elapsed_s: float, slo_ttft_ms: float) -> dict[str, Any]:
    """TTFT percentiles, errors, throughput and SLO attainment of one load phase."""
    ok = [r for r in records if r.get("ok")]
    ttft = [r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]
    errors: dict[str, int] = {}
    for r in records:
        if not r.get("ok"):
            kind = str(r.get("status") or r.get("error") or "?")[:60]
            errors[kind] = errors.get(kind, 0) + 1
    return {
        "num_requests": len(records),
        "num_ok": len(ok),
        "errors": errors,
        "ttft_ms_p50": rnd(pct(ttft, 50), 1),
        "ttft_ms_p95": rnd(pct(ttft, 95), 1),
        "ttft_ms_p99": rnd(pct(ttft, 99), 1),
        "tpot_ms_p50": rnd(pct([r["tpot_ms"] for r in ok if r.get("tpot_ms") is not None], 50), 1),
        "slo_attainment": rnd(sum(1 for t in ttft if t <= slo_ttft_ms) / len(records), 3)
        if records
        else None,
        "ok_req_s": rnd(len(ok) / elapsed_s, 3) if elapsed_s > 0 else None,
        "out_tok_s": rnd(sum(r.get("output_tokens") or 0 for r in ok) / elapsed_s, 1)
        if elapsed_s > 0
        else None,
        "elapsed_s": rnd(elapsed_s, 1),
    }


def admin_get(api_url: str, admin_key: str, path: str) -> dict[str, Any]:
    """GET an admin view (JSON)."""
    response = httpx.get(f"{api_url}{path}", headers={"Authorization": f"Bearer {admin_key}"}, timeout=10)
    response.raise_for_status()
    return response.json()


def wait_placement(
    api_url: str, admin_key: str, after_version: int, timeout_s: float
) -> dict[str, Any] | None:
    """The first published placement newer than `after_version` with rows (None past the timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = admin_get(api_url, admin_key, "/v1/admin/placement")
        if (view.get("version") or 0) > after_version and view.get("table"):
            return view
        time.sleep(0.5)
    return None


def placement_summary(view: dict[str, Any] | None) -> dict[str, Any]:
    """Holders per adapter and per-worker load / max rank of a placement view."""
    if not view:
        return {}
    holders = [len(row) for row in view.get("table", {}).values()]
    return {
        "version": view.get("version"),
        "num_adapters": len(holders),
        "num_split_adapters": sum(1 for h in holders if h > 1),
        "workers": [
            {k: w.get(k) for k in ("worker_id", "load", "max_rank", "num_adapters")}
            for w in view.get("workers", [])
        ],
    }
