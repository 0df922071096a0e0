"""One run of scheduling.py: the workload with true lengths and predictions, the engine's shared config and
memory budget, the calibration (unloaded TTFT, capacity), and the sweep of every system at every load, each
(system, load) in its own process (adapter_memory.run_child).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from adapter_memory import find_adapters, run_child
from adapter_memory_plan import (
    adapter_device_bytes,
    at_rate,
    engine_config_fields,
    kv_bytes_per_token,
    memory_budget,
)
from scheduling_metrics import drain_limit_s, run_metrics, system_label
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
from workload_args import workload_spec


def log(msg: str) -> None:
    print(f"[scheduling] {msg}", file=sys.stderr, flush=True)


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

        from gpu_workers.engine.config import EngineConfig

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
