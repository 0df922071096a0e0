"""Pure parts of the adapter-memory benchmark: the configs compared, how overrides meet this build's
EngineConfig, the memory budget, the rate sweep and the summary ratios (no engine, no processes).
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

COMPARISONS = ("policy", "split", "cpu_prefill")
# What a build without the field already does: such an override is dropped (and recorded), not skipped.
IMPLIED_WHEN_ABSENT: dict[str, Any] = {
    "adapter_eviction_policy": "lru",
    "cpu_prefill_workers": 0,
    "enable_prefix_caching": False,
}
CPU_ASSISTED_TARGET = 1.10  # cold TTFT / warm TTFT (CaraServe: +1..22%)


# ------------------------------------------------------------------------------------------ configs


def comparison_configs(comparison: str, link_gbps: float) -> list[tuple[str, dict[str, Any]]]:
    """The (config name, EngineConfig overrides) compared side by side in one comparison."""
    if comparison == "policy":
        return [(p, {"adapter_eviction_policy": p}) for p in ("lru", "chameleon", "fastlibra")]
    if comparison == "split":
        return [(m, {"memory_mode": m}) for m in ("static", "unified")]
    if comparison == "cpu_prefill":
        return [
            ("on_demand", {"cpu_prefill_workers": 0, "adapter_link_gbps": link_gbps}),
            ("cpu_assisted", {"cpu_prefill_workers": 1, "adapter_link_gbps": link_gbps}),
        ]
    raise ValueError(f"unknown comparison {comparison!r}; choose from {', '.join(COMPARISONS)}")


def engine_config_fields() -> frozenset[str]:
    """Keyword names the EngineConfig of this build accepts."""
    from gpu_workers.engine.config import EngineConfig

    if hasattr(EngineConfig, "model_fields"):  # a pydantic model since the settings sections
        return frozenset(EngineConfig.model_fields)
    return frozenset(f.name for f in dataclasses.fields(EngineConfig))


def resolve_overrides(
    overrides: dict[str, Any], fields: frozenset[str]
) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(accepted overrides, dropped ones, skip reason or None) for this build's EngineConfig fields."""
    accepted, dropped = {}, {}
    for key, value in overrides.items():
        if key in fields:
            accepted[key] = value
        elif key in IMPLIED_WHEN_ABSENT and IMPLIED_WHEN_ABSENT[key] == value:
            dropped[key] = value
        else:
            return accepted, dropped, f"EngineConfig has no field {key} (feature not in this build)"
    return accepted, dropped, None


# ------------------------------------------------------------------------------------------ memory


def adapter_device_bytes(weights: Path, element_size: int) -> int:
    """Device bytes the engine books for an adapter: its weight file's size rescaled from the file's
    element size to the engine's (as `ModelRunner.adapter_device_bytes` does)."""
    with open(weights, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    dtypes = [v["dtype"] for k, v in header.items() if k != "__metadata__"]
    file_element = {"F16": 2, "BF16": 2, "F32": 4}.get(dtypes[0] if dtypes else "F32", 4)
    return -(-weights.stat().st_size * element_size // file_element)


def kv_bytes_per_token(config: dict, element_size: int) -> int:
    """K and V bytes of one token across all layers, from a HF config.json."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * element_size


def memory_budget(
    adapter_bytes: dict[str, int], fraction: float, kv_tokens: int, kv_token_bytes: int
) -> dict[str, Any]:
    """Adapter and KV budgets: `fraction` of all adapters' device bytes, KV room for `kv_tokens` tokens."""
    if not 0 < fraction <= 1:
        raise ValueError(f"adapter budget fraction must be in (0, 1], got {fraction}")
    total = sum(adapter_bytes.values())
    largest = max(adapter_bytes.values())
    adapter_budget = max(int(total * fraction), largest)  # the largest adapter must fit alone
    kv_budget = kv_tokens * kv_token_bytes
    mean = total / len(adapter_bytes)
    return {
        "num_adapters": len(adapter_bytes),
        "total_adapter_bytes": total,
        "largest_adapter_bytes": largest,
        "adapter_budget_bytes": adapter_budget,
        "kv_budget_bytes": kv_budget,
        "kv_budget_tokens": kv_tokens,
        "total_budget_bytes": adapter_budget + kv_budget,
        "adapter_budget_fraction": round(adapter_budget / total, 4),
        "adapters_fit_at_mean_size": round(adapter_budget / mean, 1),
    }


# ------------------------------------------------------------------------------------------ workload


def at_rate(requests: list[dict], base_rps: float, rps: float) -> list[dict]:
    """The same requests with arrival offsets rescaled from base_rps to rps (Poisson gaps scale by 1/rps)."""
    scale = base_rps / rps
    return [{**r, "arrival_s": round(r["arrival_s"] * scale, 6)} for r in requests]


def sweep_rates(rps: float, rates: str) -> list[float]:
    """Rates of the split sweep: --rates (comma list) or 1/1.5/2 x rps; --rps is always included."""
    out = [float(x) for x in rates.split(",") if x.strip()] if rates else [rps * f for f in (1.0, 1.5, 2.0)]
    if not any(abs(r - rps) < 1e-9 for r in out):
        out.append(rps)
    return sorted({round(r, 6) for r in out})


def peak_rate(by_rate: dict[float, dict], target_ms: float) -> float | None:
    """Highest rate with every lower rate also within target: all completed and TTFT p99 <= target."""
    best = None
    for rate in sorted(by_rate):
        r = by_rate[rate]
        ok = r.get("ttft_ms_p99") is not None and r["ttft_ms_p99"] <= target_ms
        ok = ok and r.get("completed") == r.get("num_requests")
        if not ok:
            break
        best = rate
    return best


# ------------------------------------------------------------------------------------------ summary


def _r(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else round(num / den, 3)


def summary_ratios(lines: list[dict], rps: float) -> dict[str, Any]:
    """Headline ratios over one model's result lines (< 1 is better for latency ratios)."""
    at = {
        (x["comparison"], x["config"]): x
        for x in lines
        if "ttft_ms_p99" in x and abs(x.get("rate_rps", rps) - rps) < 1e-9
    }

    def get(comp: str, cfg: str, key: str) -> float | None:
        return at.get((comp, cfg), {}).get(key)

    out: dict[str, Any] = {}
    for pol in ("chameleon", "fastlibra"):
        for q in ("p50", "p99"):
            out[f"{pol}_vs_lru_ttft_{q}"] = _r(
                get("policy", pol, f"ttft_ms_{q}"), get("policy", "lru", f"ttft_ms_{q}")
            )
    out["hit_rate"] = {
        c: get("policy", c, "hit_rate") or get("policy", c, "request_hit_rate")
        for c in ("lru", "chameleon", "fastlibra")
        if ("policy", c) in at
    }
    for q in ("p50", "p99"):
        out[f"unified_vs_static_ttft_{q}"] = _r(
            get("split", "unified", f"ttft_ms_{q}"), get("split", "static", f"ttft_ms_{q}")
        )
    peaks = {x["config"]: x["peak_rps"] for x in lines if x.get("metric") == "peak_rps_at_ttft_target"}
    if peaks:
        out["peak_rps_at_ttft_target"] = peaks
        out["unified_vs_static_peak_rps"] = _r(peaks.get("unified"), peaks.get("static"))
    for cfg in ("on_demand", "cpu_assisted"):
        out[f"{cfg}_cold_vs_warm_ttft"] = get("cpu_prefill", cfg, "cold_vs_warm_ttft_p50")
    ratio = out["cpu_assisted_cold_vs_warm_ttft"]
    out["cpu_assisted_meets_target"] = None if ratio is None else ratio <= CPU_ASSISTED_TARGET
    return out
