"""Platform overhead of lorahost (serving.py, idle server): K interleaved pairs of identical requests through
the API and straight to the worker, and the paired TTFT differences.
"""

from __future__ import annotations

import secrets
import statistics
from typing import Any

import httpx
from serving_client import stream_completion, worker_generate
from serving_metrics import pct, rnd
from serving_systems import Lorahost


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
