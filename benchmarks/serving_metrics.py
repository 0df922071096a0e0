"""Serving metrics from per-request records: percentiles (the one percentile definition of every benchmark),
TTFT/TPOT/E2E, throughput, goodput within the SLOs, error counts (pure).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any


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


SUMMARY_KEYS = (
    "ttft_ms_p50",
    "ttft_ms_p99",
    "ttft_text_ms_p50",
    "tpot_ms_p50",
    "e2e_ms_p50",
    "goodput_rps",
    "throughput_rps",
    "out_tok_s",
    "num_errors",
)
# (numerator system, denominator system): lorahost (native engine) against bare vLLM; the platform's cost on top
# of vLLM (vLLM behind a lorahost worker against bare vLLM); and the two engines behind the same platform
RATIOS = (("lorahost", "vllm"), ("lorahost-vllm", "vllm"), ("lorahost", "lorahost-vllm"))
RATIO_METRICS = {
    "ttft_p50": "ttft_ms_p50",
    "ttft_p99": "ttft_ms_p99",
    "ttft_text_p50": "ttft_text_ms_p50",
    "ttft_text_p99": "ttft_text_ms_p99",
    "tpot_p50": "tpot_ms_p50",
    "e2e_p50": "e2e_ms_p50",
    "goodput": "goodput_rps",
    "out_tok_s": "out_tok_s",
}


def summary_line(common: dict, results: dict[str, dict | None]) -> dict[str, Any]:
    """The {"system": "summary"} line: each system's headline metrics and the ratios between them (RATIOS;
    keys like ttft_p50_lorahost_vs_vllm, ttft_p50_lorahost-vllm_vs_vllm)."""
    summary: dict[str, Any] = {"system": "summary", **common}
    for name, res in results.items():
        if res:
            for k in SUMMARY_KEYS:
                summary[f"{name}_{k}"] = res.get(k)
    for top, bottom in RATIOS:
        a, b = results.get(top), results.get(bottom)
        if not (a and b):
            continue
        for label, k in RATIO_METRICS.items():
            if a.get(k) is not None and b.get(k):
                summary[f"{label}_{top}_vs_{bottom}"] = round(a[k] / b[k], 3)
        if not b.get("goodput_rps"):
            summary[f"goodput_note_{top}_vs_{bottom}"] = f"{bottom} goodput is 0: no ratio"
    return summary
