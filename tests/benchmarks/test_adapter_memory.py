"""The adapter-memory benchmark's pure parts: configs vs this build's EngineConfig (skipped lines),
the memory budget, the rate sweep, the per-run metrics and the summary ratios. No engine speed is asserted."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import adapter_memory
from adapter_memory_plan import (
    adapter_device_bytes,
    comparison_configs,
    engine_config_fields,
    kv_bytes_per_token,
    memory_budget,
    peak_rate,
    resolve_overrides,
    summary_ratios,
    sweep_rates,
)
from adapter_memory_replay import pct, summarize_records

TRACE = BENCH.parent.parent / "shared" / "data" / "azure_llm_2023_conv.csv"


# ---- configs vs EngineConfig ------------------------------------------------------------------------


def test_unknown_engine_field_gives_a_skip_reason_naming_it() -> None:
    fields = engine_config_fields()
    assert "model_path" in fields and "adapter_cache_bytes" in fields
    *_, skip = resolve_overrides({"kv_cache_bytes": 1, "no_such_field_xyz": 3}, fields)
    assert skip == "EngineConfig has no field no_such_field_xyz (feature not in this build)"


def test_implied_default_of_an_absent_field_is_dropped_not_skipped() -> None:
    fields = frozenset({"model_path", "kv_cache_bytes"})
    assert resolve_overrides({"adapter_eviction_policy": "lru", "kv_cache_bytes": 5}, fields) == (
        {"kv_cache_bytes": 5},
        {"adapter_eviction_policy": "lru"},
        None,
    )
    _, _, skip = resolve_overrides({"adapter_eviction_policy": "chameleon"}, fields)
    assert skip == "EngineConfig has no field adapter_eviction_policy (feature not in this build)"


def test_present_field_is_passed_through_even_when_it_has_an_implied_default() -> None:
    fields = frozenset({"adapter_eviction_policy", "cpu_prefill_workers", "adapter_link_gbps"})
    for name, overrides in comparison_configs("cpu_prefill", 4.0) + comparison_configs("policy", 4.0):
        overrides = {k: v for k, v in overrides.items() if k in fields}
        assert resolve_overrides(overrides, fields) == (overrides, {}, None), name


def test_comparison_configs_name_the_engine_fields() -> None:
    assert [n for n, _ in comparison_configs("policy", 1.0)] == ["lru", "chameleon", "fastlibra"]
    assert comparison_configs("split", 1.0) == [
        ("static", {"memory_mode": "static"}),
        ("unified", {"memory_mode": "unified"}),
    ]
    assert dict(comparison_configs("cpu_prefill", 2.5)) == {
        "on_demand": {"cpu_prefill_workers": 0, "adapter_link_gbps": 2.5},
        "cpu_assisted": {"cpu_prefill_workers": 1, "adapter_link_gbps": 2.5},
    }
    with pytest.raises(ValueError, match="unknown comparison"):
        comparison_configs("nope", 1.0)


@pytest.fixture
def bench(demo_dir: Path, tmp_path: Path) -> adapter_memory.Bench:
    trace = (
        TRACE if TRACE.exists() else _synthetic_trace(tmp_path / "trace.csv")
    )  # a clean clone has no ../shared
    args = adapter_memory.parse_args(
        ["--quick", "--model-dir", str(demo_dir), "--out", str(tmp_path / "out.jsonl"), "--trace", str(trace)]
    )
    lines: list[dict] = []
    b = adapter_memory.Bench(args, demo_dir, lines.append)
    b.emitted = lines  # type: ignore[attr-defined]
    return b


def _synthetic_trace(path: Path) -> Path:
    """A trace file in the Azure trace's format (TIMESTAMP, ContextTokens, GeneratedTokens), seeded."""
    rng = random.Random(0)
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(64):
        rows.append(
            f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.0000000,{rng.randint(20, 900)},{rng.randint(1, 200)}"
        )
    path.write_text("\n".join(rows) + "\n")
    return path


def test_prepare_sizes_the_budget_and_writes_one_budget_line(bench: adapter_memory.Bench) -> None:
    bench.prepare()
    (line,) = bench.emitted  # type: ignore[attr-defined]
    assert line["metric"] == "memory_budget"
    assert line["adapter_budget_bytes"] == bench.engine_base["adapter_cache_bytes"]
    assert line["kv_budget_bytes"] == bench.engine_base["kv_cache_bytes"]
    assert line["total_budget_bytes"] == line["adapter_budget_bytes"] + line["kv_budget_bytes"]
    assert len(bench.workload) == line["workload"]["num_requests"] == 16
    assert {r["adapter"] for r in bench.workload} <= set(bench.adapters)


def test_comparison_skips_missing_fields_and_runs_the_rest(
    bench: adapter_memory.Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench.fields = frozenset({"model_path", "adapter_cache_bytes", "kv_cache_bytes"})  # a pre-feature build
    ran: list[tuple] = []
    monkeypatch.setattr(bench, "run", lambda comp, name, acc, drop, rate: ran.append((comp, name, acc, drop)))
    bench.comparison("policy")
    bench.comparison("split")
    assert ran == [("policy", "lru", {}, {"adapter_eviction_policy": "lru"})]
    skipped = {x["config"]: x["skipped"] for x in bench.emitted if "skipped" in x}  # type: ignore[attr-defined]
    assert skipped == {
        "chameleon": "EngineConfig has no field adapter_eviction_policy (feature not in this build)",
        "fastlibra": "EngineConfig has no field adapter_eviction_policy (feature not in this build)",
        "static": "EngineConfig has no field memory_mode (feature not in this build)",
        "unified": "EngineConfig has no field memory_mode (feature not in this build)",
    }
    json.dumps(bench.emitted)  # type: ignore[attr-defined]


def test_split_sweeps_rates_and_reports_the_peak(
    bench: adapter_memory.Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench.fields = frozenset({"memory_mode"})
    bench.args.ttft_target_ms = 100.0
    bench.args.rates = "1,2,3"
    p99 = {("static", 1.0): 50.0, ("static", 2.0): 150.0, ("static", 3.0): 90.0, ("unified", 1.0): 40.0}
    p99.update({("unified", 2.0): 60.0, ("unified", 3.0): 99.0})

    def fake_run(comp: str, name: str, acc: dict, drop: dict, rate: float) -> dict:
        line = {"comparison": comp, "config": name, "rate_rps": rate, "num_requests": 4, "completed": 4}
        line["ttft_ms_p99"] = p99[(name, rate)]
        bench.lines.append(line)
        return line

    monkeypatch.setattr(bench, "run", fake_run)
    bench.comparison("split")
    peaks = {x["config"]: x["peak_rps"] for x in bench.lines if x.get("metric") == "peak_rps_at_ttft_target"}
    assert peaks == {"static": 1.0, "unified": 3.0}  # static fails at 2: its pass at 3 does not count


# ---- memory ------------------------------------------------------------------------------------------


def test_budget_estimate_matches_the_engines_adapter_bytes(
    base_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    from gpu_workers.engine.config import EngineConfig
    from gpu_workers.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model_path=base_model_dir, dtype="float32", kv_cache_bytes=1 << 20))
    for name, path in adapter_dirs.items():
        engine.register_adapter(name, path)
        expected = engine.residency.get(name).num_bytes
        assert adapter_device_bytes(path / "adapter_model.safetensors", 4) == expected
    cfg = json.loads((base_model_dir / "config.json").read_text())
    assert kv_bytes_per_token(cfg, 4) * engine.config.block_size == engine.runner.kv_bytes_per_block()


def test_memory_budget_math() -> None:
    sizes = {"a": 100, "b": 300, "c": 600}
    b = memory_budget(sizes, 0.2, kv_tokens=10, kv_token_bytes=8)
    assert b["total_adapter_bytes"] == 1000
    assert b["adapter_budget_bytes"] == 600  # 20% is 200, but the largest adapter (600) must fit alone
    assert b["kv_budget_bytes"] == 80 and b["total_budget_bytes"] == 680
    assert memory_budget(sizes, 0.9, 10, 8)["adapter_budget_bytes"] == 900
    with pytest.raises(ValueError):
        memory_budget(sizes, 0.0, 10, 8)


# ---- workload and rates ------------------------------------------------------------------------------


def test_at_rate_scales_arrivals_only() -> None:
    reqs = [{"index": 0, "arrival_s": 1.0, "adapter": "a"}, {"index": 1, "arrival_s": 3.0, "adapter": "b"}]
    out = adapter_memory.at_rate(reqs, base_rps=1.0, rps=2.0)
    assert [r["arrival_s"] for r in out] == [0.5, 1.5]
    assert [r["adapter"] for r in out] == ["a", "b"] and reqs[0]["arrival_s"] == 1.0


def test_sweep_rates_include_the_main_rate() -> None:
    assert sweep_rates(1.0, "") == [1.0, 1.5, 2.0]
    assert sweep_rates(1.0, "2,0.5") == [0.5, 1.0, 2.0]


def test_peak_rate_needs_every_request_done() -> None:
    by_rate = {1.0: {"ttft_ms_p99": 10.0, "num_requests": 4, "completed": 4}}
    by_rate[2.0] = {"ttft_ms_p99": 10.0, "num_requests": 4, "completed": 3}
    assert peak_rate(by_rate, 50.0) == 1.0
    assert peak_rate(by_rate, 5.0) is None


# ---- per-run metrics and summary ---------------------------------------------------------------------


def _rec(arrival: float, first: float | None, times: list[float], cold: bool, first_of: bool) -> dict:
    return {
        "arrival": arrival,
        "first_token": first,
        "finish": times[-1] if times else None,
        "finish_reason": "length" if times else None,
        "token_times": times,
        "num_output_tokens": len(times),
        "cold": cold,
        "first_of_adapter": first_of,
    }


def test_pct_interpolates_like_numpy() -> None:
    assert pct([], 50) is None
    assert pct([3.0, 1.0, 2.0], 50) == 2.0
    assert pct([0.0, 10.0], 99) == pytest.approx(9.9)


def test_summarize_records_splits_cold_and_warm() -> None:
    records = [
        _rec(0.0, 0.4, [0.4, 0.5, 0.6], cold=True, first_of=True),  # ttft 400 ms
        _rec(1.0, 1.1, [1.1, 1.3], cold=False, first_of=False),  # ttft 100 ms
        _rec(2.0, 2.2, [2.2, 2.3], cold=False, first_of=False),  # ttft 200 ms
        _rec(3.0, None, [], cold=True, first_of=True),  # never started
    ]
    m = summarize_records(records, {"num_adapter_loads": 2, "unrelated": 1, "num_adapter_hits": 2})
    assert m["num_requests"] == 4 and m["completed"] == 3 and m["num_incomplete"] == 1
    assert m["ttft_ms_p50"] == 200.0
    assert m["cold_ttft_ms_p50"] == 400.0 and m["warm_ttft_ms_p50"] == 150.0
    assert m["cold_vs_warm_ttft_p50"] == pytest.approx(400 / 150, abs=1e-3)
    assert (
        m["num_cold"] == 1 and m["num_warm"] == 2 and m["request_hit_rate"] == pytest.approx(2 / 3, abs=1e-4)
    )
    assert m["hit_rate"] is None  # no misses counter in these stats: no engine hit rate
    assert m["tbt_ms_p99"] == pytest.approx(197.0, abs=0.5)  # gaps 100,100,200,100 ms
    assert m["throughput_rps"] == pytest.approx(3 / 2.3, abs=1e-3)
    assert m["out_tok_s"] == pytest.approx(7 / 2.3, abs=0.01)
    assert m["stats"] == {"num_adapter_loads": 2, "num_adapter_hits": 2}
    m2 = summarize_records(records, {"num_adapter_hits": 3, "num_adapter_misses": 1})
    assert m2["hit_rate"] == 0.75


def test_summary_ratios() -> None:
    def line(comp: str, cfg: str, p50: float, p99: float, **kw: float) -> dict:
        return {
            "comparison": comp,
            "config": cfg,
            "rate_rps": 1.0,
            "ttft_ms_p50": p50,
            "ttft_ms_p99": p99,
            **kw,
        }

    lines = [
        line("policy", "lru", 100, 400, hit_rate=0.5),
        line("policy", "chameleon", 90, 300, hit_rate=0.6),
        line("split", "static", 200, 1000),
        line("split", "unified", 100, 400),
        line("split", "unified", 500, 5000) | {"rate_rps": 2.0},  # another sweep rate: not the headline
        {"comparison": "split", "config": "static", "metric": "peak_rps_at_ttft_target", "peak_rps": 1.0},
        {"comparison": "split", "config": "unified", "metric": "peak_rps_at_ttft_target", "peak_rps": 2.0},
        line("cpu_prefill", "on_demand", 1, 1, cold_vs_warm_ttft_p50=5.12),
        line("cpu_prefill", "cpu_assisted", 1, 1, cold_vs_warm_ttft_p50=1.05),
        {"comparison": "policy", "config": "fastlibra", "skipped": "EngineConfig has no field x"},
    ]
    s = summary_ratios(lines, 1.0)
    assert s["chameleon_vs_lru_ttft_p99"] == 0.75 and s["chameleon_vs_lru_ttft_p50"] == 0.9
    assert s["fastlibra_vs_lru_ttft_p99"] is None
    assert s["hit_rate"] == {"lru": 0.5, "chameleon": 0.6}
    assert s["unified_vs_static_ttft_p50"] == 0.5 and s["unified_vs_static_ttft_p99"] == 0.4
    assert s["unified_vs_static_peak_rps"] == 2.0
    assert s["on_demand_cold_vs_warm_ttft"] == 5.12 and s["cpu_assisted_cold_vs_warm_ttft"] == 1.05
    assert s["cpu_assisted_meets_target"] is True
