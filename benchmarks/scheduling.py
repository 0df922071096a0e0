"""Scheduling: batch policies (FIFO, SJF, multi-queue, ...) with and without the adapter cache, on the real
engine, swept from light load to overload.

Workload (benchmarks/scheduling_workload.py): 100 demo adapters of ranks 8..128 on the `small` model,
Zipf popularity, prompt lengths from the Azure conv trace scaled to the model, Poisson arrivals, and a
per-adapter log-normal output-length distribution (medians drawn from the trace's output lengths, scaled).
Every request carries the prediction of a LengthPredictor trained on a separate history drawn from the
same distributions (held-out MAE and bucket accuracy are reported); the engine only sees the prediction and
the API cap, and the replay stops each request at its true length.

Systems, side by side in one run, each (system, load) in its own process (benchmarks/adapter_memory.py's
child runner and open-loop replay): every name of --policies registered in scheduler/batch_policy.py
BATCH_POLICIES (others are skipped with a note), each with the adapter cache (`is_caching_idle_adapters`)
and without it (an adapter leaves the device as soon as no request uses it: the S-LoRA baseline).

First the unloaded mean TTFT (requests one at a time) and the saturation throughput (every request at
once) of FIFO with the cache; then Poisson rates = --loads x that capacity. Per point: P50/P99 TTFT, P99
TBT, throughput, adapter hit rate, queueing share of E2E per size class; per system the throughput at a
TTFT SLO of 5x the unloaded mean; and a summary against Chameleon's targets
(benchmarks/scheduling_metrics.py).

    /work/main/.venv/bin/python benchmarks/scheduling.py --quick          # smoke, ~2 min
    /work/main/.venv/bin/python benchmarks/scheduling.py                  # full sweep, ~25 min on 2 cores
    /work/main/.venv/bin/python benchmarks/scheduling.py --policies fifo,sjf --loads 0.5,1,1.5

Tables on stdout, progress on stderr, everything in one JSON file (--out). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))  # this tree's scheduler/, not an installed copy

from adapter_memory import ensure_model, find_adapters, run_child
from adapter_memory_plan import (
    adapter_device_bytes,
    at_rate,
    engine_config_fields,
    kv_bytes_per_token,
    memory_budget,
)
from run_info import git_state
from scheduling_metrics import (
    drain_limit_s,
    report_text,
    run_metrics,
    summarize_systems,
    system_label,
)
from scheduling_workload import (
    attach_lengths,
    history_samples,
    output_length_models,
    prediction_report,
    prime_requests,
    size_class,
    size_cutoffs,
    synthetic_trace_rows,
    total_tokens,
    trace_lengths,
    train_predictor,
    write_trace_csv,
)
from serving_metrics import pct
from serving_workload import build_workload, popularity_order
from workload_args import add_workload_args, workload_spec

from scheduler.batch_policy import BATCH_POLICIES

DEFAULT_LOADS = "0.3,0.6,0.8,1.0,1.2,1.5"
DEFAULT_POLICIES = "fifo,sjf,multiqueue"


def log(msg: str) -> None:
    print(f"[scheduling] {msg}", file=sys.stderr, flush=True)


def resolve_policies(names: str) -> tuple[list[str], list[str]]:
    """(registered policy names in the given order, names not in BATCH_POLICIES)."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    return [n for n in wanted if n in BATCH_POLICIES], [n for n in wanted if n not in BATCH_POLICIES]


def parse_loads(text: str) -> list[float]:
    """Sorted distinct positive load multiples from a comma list; ValueError on anything else."""
    try:
        loads = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise ValueError(f"--loads must be a comma list of numbers, got {text!r}") from exc
    if not loads or loads[0] <= 0:
        raise ValueError(f"--loads needs positive multiples of the capacity, got {text!r}")
    return loads


def policy_overrides(policy: str, slo_s: float, common: dict[str, Any]) -> dict[str, Any]:
    """EngineConfig knobs a policy takes from the benchmark: multiqueue's quota rule gets the benchmark's TTFT
    SLO (unless --engine-args sets it, or this build's EngineConfig has no such field)."""
    if policy != "multiqueue" or "multiqueue_slo_s" in common:
        return {}
    return {"multiqueue_slo_s": round(slo_s, 4)} if "multiqueue_slo_s" in engine_config_fields() else {}


class SchedulingBench:
    """One run: workload, predictor, calibration, the sweep, the report."""

    def __init__(self, args: argparse.Namespace, model_dir: Path) -> None:
        self.args, self.model_dir = args, model_dir
        self.base = model_dir / "base"
        self.adapters = find_adapters(model_dir, args.num_adapters)
        self.log_dir = args.out.parent / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.report: dict[str, Any] = {"benchmark": "scheduling", "model": str(model_dir)}

    # ---- workload ---------------------------------------------------------------------------------

    def trace_path(self) -> Path:
        """The Azure trace, or a synthetic stand-in (written to the log dir) when it is missing."""
        if self.args.trace.exists():
            return self.args.trace
        rows = synthetic_trace_rows(self.args.num_requests + self.args.num_history + 1000, self.args.seed)
        path = write_trace_csv(rows, self.log_dir / "scheduling-synthetic-trace.csv")
        log(f"NOTE: {self.args.trace} is missing; using a synthetic trace of the same shape ({path})")
        self.report["synthetic_trace"] = str(path)
        return path

    def prepare(self) -> None:
        """Requests with true lengths and predictions, the predictor's accuracy, the size classes."""
        a = self.args
        trace = self.trace_path()
        contexts, generated = trace_lengths(trace)
        names = list(self.adapters)
        models = output_length_models(names, generated, a.length_scale, a.max_output_tokens, a.seed)
        start = a.trace_offset + a.num_requests  # history prompts: the trace rows after the workload's
        history = history_samples(
            models,
            popularity_order(names, a.seed),
            a.zipf_alpha,
            [contexts[(start + i) % len(contexts)] for i in range(a.num_history)],
            a.length_scale,
            a.max_prompt_tokens,
            a.max_output_tokens,
            a.seed,
        )
        predictor, held_out = train_predictor(history, a.seed)
        self.prime = prime_requests(history, predictor, a.num_prime, a.seed)
        self.requests = attach_lengths(
            self._base_requests(trace), models, predictor, a.max_output_tokens, a.seed
        )
        cutoffs = size_cutoffs([total_tokens(r) for r in self.requests])
        self.class_of = {r["index"]: size_class(total_tokens(r), cutoffs) for r in self.requests}
        self.report["predictor"] = {
            "num_history": len(history),
            "num_train": len(history) - len(held_out),
            "held_out": prediction_report(predictor, held_out, a.length_scale),
            "workload": self._workload_prediction_accuracy(),
        }
        self.report["workload"] = self._workload_shape(cutoffs)
        self.report["adapter_output_lengths"] = {
            name: {"median": round(m.median, 2), "sigma": round(m.sigma, 3)} for name, m in models.items()
        }

    def _base_requests(self, trace: Path) -> list[dict[str, Any]]:
        """Prompts, adapters and Poisson arrivals at 1 req/s (serving_workload.build_workload)."""
        spec = workload_spec(
            self.args, trace_path=trace, tokenizer_dir=self.base, adapters=tuple(self.adapters), rps=1.0
        )
        keys = ("index", "arrival_s", "adapter", "prompt_tokens", "prompt_token_ids")
        return [{k: getattr(r, k) for k in keys} for r in build_workload(spec)]

    def _workload_prediction_accuracy(self) -> dict[str, Any]:
        errors = [abs(r["predicted_output_tokens"] - r["output_tokens"]) for r in self.requests]
        return {"num_requests": len(errors), "mae": round(sum(errors) / len(errors), 3)}

    def _workload_shape(self, cutoffs: tuple[float, float]) -> dict[str, Any]:
        reqs = self.requests
        outs = [r["output_tokens"] for r in reqs]
        counts = {c: sum(1 for v in self.class_of.values() if v == c) for c in ("small", "medium", "large")}
        return {
            "num_requests": len(reqs),
            "num_distinct_adapters": len({r["adapter"] for r in reqs}),
            "prompt_tokens_mean": round(sum(r["prompt_tokens"] for r in reqs) / len(reqs), 1),
            "output_tokens_mean": round(sum(outs) / len(outs), 1),
            "output_tokens_p50_p90_max": [pct(outs, 50), pct(outs, 90), max(outs)],
            "size_cutoffs_total_tokens": [round(c, 1) for c in cutoffs],
            "num_by_size_class": counts,
        }

    # ---- engine and children ------------------------------------------------------------------------

    def engine_common(self) -> dict[str, Any]:
        """EngineConfig kwargs every system shares: memory budget (as adapter_memory.py), batch limit,
        on-demand adapter copies over the emulated link, threads, eviction policy."""
        import torch

        from gpu_workers.config import EngineConfig

        a = self.args
        dtype = EngineConfig(model_path=self.base, dtype=a.dtype).resolved_dtype()
        elem = torch.empty((), dtype=dtype).element_size()
        sizes = {
            n: adapter_device_bytes(p / "adapter_model.safetensors", elem) for n, p in self.adapters.items()
        }
        cfg = json.loads((self.base / "config.json").read_text())
        kv_tokens = a.max_num_seqs * (a.max_prompt_tokens + a.max_output_tokens)
        self.report["budget"] = memory_budget(
            sizes, a.adapter_budget_fraction, kv_tokens, kv_bytes_per_token(cfg, elem)
        )
        common = {
            "dtype": a.dtype,
            "num_threads": a.threads or None,
            "adapter_cache_bytes": self.report["budget"]["adapter_budget_bytes"],
            "kv_cache_bytes": self.report["budget"]["kv_budget_bytes"],
            "max_num_seqs": a.max_num_seqs,
            "adapter_eviction_policy": a.eviction_policy,
            "cpu_prefill_workers": 0,
            "adapter_link_gbps": a.link_gbps or None,
            **json.loads(a.engine_args or "{}"),
        }
        self.report["engine_common"] = {**common, "resolved_dtype": str(dtype).replace("torch.", "")}
        return common

    def write_requests(self, name: str, requests: list[dict]) -> Path:
        """The request list a child replays (token ids included), written once per load."""
        path = self.log_dir / f"scheduling-workload-{name}.json"
        path.write_text(json.dumps(requests))
        return path

    def child(
        self, tag: str, engine: dict[str, Any], workload: Path, mode: str, drain_s: float, **extra: Any
    ) -> dict[str, Any]:
        """Run one replay (or calibration) in a fresh process; its result dict."""
        spec = {
            "mode": mode,
            "model_base": str(self.base),
            "adapters": {n: str(p) for n, p in self.adapters.items()},
            "workload_path": str(workload),
            "engine": engine,
            "drain_s": drain_s,
            "num_calibration": self.args.num_calibration,
            "return_records": mode == "replay",
            **extra,
        }
        return run_child(spec, self.log_dir / f"scheduling-{tag}.log", self.args.timeout)

    def calibrate(self, common: dict[str, Any]) -> None:
        """Unloaded mean TTFT (one request at a time) and saturation throughput (all at once), both of FIFO
        with the adapter cache."""
        a, engine = self.args, {**common, "batch_policy": "fifo", "is_caching_idle_adapters": True}
        cal: dict[str, Any] = {"system": system_label("fifo", True)}
        if a.unloaded_ttft_ms:
            cal["unloaded_ttft_ms_mean"] = a.unloaded_ttft_ms
        else:
            log("measuring the unloaded TTFT (requests one at a time)")
            res = self.child(
                "unloaded", engine, self.write_requests("unloaded", self.requests), "calibrate", 0.0
            )
            cal.update(
                {k: v for k, v in res.items() if k.startswith(("unloaded", "num_cal", "error", "log"))}
            )
        if a.capacity_rps:
            cal["capacity_rps"] = a.capacity_rps
        else:
            log(f"measuring the saturation throughput ({len(self.requests)} requests at once)")
            at_once = self.write_requests("capacity", [{**r, "arrival_s": 0.0} for r in self.requests])
            res = self.child("capacity", engine, at_once, "replay", a.timeout)  # every request must finish
            cal["capacity_rps"] = res.get("throughput_rps")
            cal["capacity_run"] = {
                k: res.get(k) for k in ("completed", "num_requests", "makespan_s", "out_tok_s", "error")
            }
        self.report["calibration"] = cal
        if not cal.get("capacity_rps") or not cal.get("unloaded_ttft_ms_mean"):
            raise SystemExit(f"calibration failed: {json.dumps(cal)}")
        self.slo_ms = a.slo_ttft_ms or a.slo_factor * cal["unloaded_ttft_ms_mean"]
        cal["slo_ttft_ms"] = round(self.slo_ms, 2)

    def sweep(self, common: dict[str, Any], policies: list[str], caches: list[bool]) -> list[dict[str, Any]]:
        """Every load (outer loop, so machine noise hits all systems of a load alike) x every system."""
        a, capacity = self.args, self.report["calibration"]["capacity_rps"]
        points = []
        for load in a.loads:
            rate = round(load * capacity, 4)
            requests = at_rate(self.requests, 1.0, rate)
            workload = self.write_requests(f"load-{load:g}", requests)
            span = max(r["arrival_s"] for r in requests)
            drain = a.drain_s or drain_limit_s(span, a.drain_factor, a.min_drain_s)
            prime = at_rate(self.prime, 1.0, rate)
            for is_caching in caches:
                for policy in policies:
                    engine = {
                        **common,
                        **policy_overrides(policy, self.slo_ms / 1000.0, common),
                        "batch_policy": policy,
                        "is_caching_idle_adapters": is_caching,
                    }
                    points.append(self.run_point(engine, workload, prime, load, rate, drain))
        return points

    def run_point(
        self,
        engine: dict[str, Any],
        workload: Path,
        prime: list[dict],
        load: float,
        rate: float,
        drain: float,
    ) -> dict[str, Any]:
        """One system at one load, in its own process: the point's metrics."""
        policy, is_caching = engine["batch_policy"], engine["is_caching_idle_adapters"]
        label = system_label(policy, is_caching)
        tag = f"{policy}-{'cache' if is_caching else 'nocache'}-{load:g}"
        res = self.child(tag, engine, workload, "replay", drain, policy_history=prime)
        point = {
            "system": label,
            "policy": policy,
            "is_caching": is_caching,
            "load": load,
            "rate_rps": rate,
            "drain_s": round(drain, 2),
            **run_metrics(res, self.class_of),
            "wall_s": res.get("wall_s"),
            "foreign_busy_cores_during": res.get("foreign_busy_cores_during"),
            "policy_state": res.get("policy_state"),
        }
        done = f"{point.get('completed')}/{point.get('num_requests')}"
        log(f"load {load:g} ({rate:g} req/s) {label}: ttft p99 {point.get('ttft_ms_p99')} ms, done {done}")
        return point


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: tiny model, 12 requests, loads 0.5,1.5")
    p.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help="batch policy names (BATCH_POLICIES); unknown ones are skipped",
    )
    p.add_argument("--cache", default="on,off", help="adapter cache settings to run: on, off or on,off")
    p.add_argument(
        "--loads", default=DEFAULT_LOADS, help="Poisson rates as multiples of the measured capacity"
    )
    p.add_argument(
        "--num-requests",
        type=int,
        default=48,
        help="requests per load point (48: the default run takes ~25 min on 2 cores)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dtype", default="auto", help="engine dtype (auto: bfloat16 on a CPU with fast bf16, else float32)"
    )
    p.add_argument(
        "--model-dir", type=Path, help="a dir with base/ and adapters/ (default: the --size demo model)"
    )
    p.add_argument(
        "--size", default=None, help="demo model size: small (default) or tiny (default with --quick)"
    )
    p.add_argument("--num-adapters", type=int, default=100)
    p.add_argument(
        "--num-history",
        type=int,
        default=3000,
        help="past requests the length predictor trains on (80%%) and is tested on (20%%)",
    )
    p.add_argument(
        "--num-prime",
        type=int,
        default=200,
        help="recent history requests shown to the batch policy before each replay (0: start cold)",
    )
    add_workload_args(
        p,
        max_prompt_tokens=128,
        max_output_tokens=64,
        length_scale=0.125,
        helps={
            "max_output_tokens": "the API cap (max_tokens) of every request",
            "length_scale": "trace lengths x this (prompts and output medians)",
        },
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=8,
        help="engine batch limit (KV budget = this many max-length requests)",
    )
    p.add_argument(
        "--adapter-budget-fraction",
        type=float,
        default=0.2,
        help="device bytes for adapters, of all adapters' bytes",
    )
    p.add_argument("--eviction-policy", default="chameleon", help="adapter_eviction_policy of the cache")
    p.add_argument(
        "--link-gbps", type=float, default=0.5, help="emulated host->device adapter link, GB/s (0: none)"
    )
    p.add_argument("--threads", type=int, default=1, help="engine num_threads (0: torch default)")
    p.add_argument("--engine-args", default="", help="extra EngineConfig kwargs for every system, as JSON")
    p.add_argument(
        "--num-calibration", type=int, default=16, help="requests of the unloaded-TTFT measurement"
    )
    p.add_argument("--slo-factor", type=float, default=5.0, help="TTFT SLO = this x the unloaded mean TTFT")
    p.add_argument("--slo-ttft-ms", type=float, default=0.0, help="fixed TTFT SLO (overrides --slo-factor)")
    p.add_argument("--unloaded-ttft-ms", type=float, default=0.0, help="skip measuring it (use this value)")
    p.add_argument("--capacity-rps", type=float, default=0.0, help="skip measuring it (use this value)")
    p.add_argument(
        "--drain-factor",
        type=float,
        default=0.25,
        help="drain limit = this x the arrival span (at least --min-drain-s): requests unfinished then "
        "are unfinished, so a system that needs 25%% longer than the arrivals take does not finish the point",
    )
    p.add_argument("--min-drain-s", type=float, default=5.0)
    p.add_argument(
        "--drain-s",
        type=float,
        default=0.0,
        help="a fixed drain limit for every point (overrides the factor)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    p.add_argument("--out", type=Path, default=HERE / "results" / "scheduling.json")
    args = p.parse_args(argv)
    if args.quick:
        args.size = args.size or "tiny"
        args.num_requests = min(args.num_requests, 12)
        args.loads = "0.5,1.5" if args.loads == DEFAULT_LOADS else args.loads
        args.num_history = min(args.num_history, 600)
        args.num_calibration = min(args.num_calibration, 4)
    args.size = args.size or "small"
    try:
        args.loads = parse_loads(args.loads)
    except ValueError as exc:
        p.error(str(exc))
    modes = [m.strip() for m in args.cache.split(",") if m.strip()]
    if not modes or any(m not in ("on", "off") for m in modes):
        p.error(f"--cache takes on, off or on,off; got {args.cache!r}")
    args.caches = [m == "on" for m in modes]
    if args.num_requests < 3:
        p.error("--num-requests must be at least 3 (size classes are tertiles)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    policies, skipped = resolve_policies(args.policies)
    for name in skipped:
        log(f"NOTE: batch policy {name!r} is not in BATCH_POLICIES {sorted(BATCH_POLICIES)}: skipped")
    if not policies:
        raise SystemExit(f"no registered batch policy among {args.policies!r}")
    model_dir = (
        (args.model_dir or Path(f"~/.cache/lorahost/bench-{args.size}-{args.num_adapters}"))
        .expanduser()
        .resolve()
    )
    if not args.model_dir:
        ensure_model(model_dir, args.size, args.num_adapters)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    bench = SchedulingBench(args, model_dir)
    bench.prepare()
    common = bench.engine_common()
    bench.calibrate(common)
    points = bench.sweep(common, policies, args.caches)
    by_system: dict[str, list[dict]] = {}
    for point in points:
        by_system.setdefault(point["system"], []).append(point)
    summary = summarize_systems(by_system, policies, args.caches, bench.slo_ms)
    report = {
        **bench.report,
        "policies": policies,
        "skipped_policies": skipped,
        "points": points,
        "summary": summary,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "git": git_state(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "wall_s": round(time.time() - started, 1),
    }
    args.out.write_text(json.dumps(report, indent=1))
    print(report_text(report))
    return 0 if all("error" not in p for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
