"""Adapter memory: eviction policy, static vs unified memory, on-demand vs CPU-assisted cold starts.

Real engine, more adapters than fit (default 100 demo adapters, ranks 8..128, varied target modules, with
the device memory sized so ~20% of their bytes fit), power-law popularity, request lengths from the Azure
LLM conversation trace. Comparisons (`--comparisons`), each config in its own process, same workload and
same total memory budget within a comparison:

- policy: `adapter_eviction_policy` lru vs chameleon vs fastlibra: hit rate, TTFT p50/p99;
- split: `memory_mode` static vs unified: TTFT p50/p99 at --rps and the peak rate (over --rates) whose
  TTFT p99 stays under --ttft-target-ms (default 5x the unloaded mean TTFT of a first light-load run);
- cpu_prefill: `cpu_prefill_workers` 0 (on demand: wait for the copy) vs 1 (CPU-assisted prefill), both
  over an emulated host->device link (`adapter_link_gbps`): cold TTFT / warm TTFT (target <= 1.10).

A config whose keys `EngineConfig` does not accept prints `{"config": ..., "skipped": "EngineConfig has no
field X (feature not in this build)"}` and the run goes on (a key whose value is what a build without the
field already does, e.g. lru, is dropped instead and listed under `dropped_absent`).

    /work/main/.venv/bin/python benchmarks/adapter_memory.py                 # ~10-15 min on 2 cores
    /work/main/.venv/bin/python benchmarks/adapter_memory.py --quick --size tiny
    /work/main/.venv/bin/python benchmarks/adapter_memory.py --comparisons policy --rps 1.5

One JSON line per result on stdout (and appended to benchmarks/results/adapter_memory.jsonl), a final
summary line with the ratios. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from adapter_memory_plan import (
    COMPARISONS,
    adapter_device_bytes,
    at_rate,
    comparison_configs,
    engine_config_fields,
    kv_bytes_per_token,
    memory_budget,
    peak_rate,
    resolve_overrides,
    summary_ratios,
    sweep_rates,
)
from adapter_memory_replay import run_one
from bench_dtype import add_dtype_arg
from child_process import ChildClock, busy_cores, child_env, wait_with_timeout
from run_info import git_state
from serving_workload import build_workload, summarize
from workload_args import add_workload_args, workload_spec

# ------------------------------------------------------------------------------------------ model


def ensure_model(model_dir: Path, size: str, num_adapters: int) -> None:
    """Generate the demo model + adapters once (seeded; written to a temp dir, then renamed)."""
    marker = model_dir / "adapters" / f"adapter-{num_adapters - 1:02d}" / "adapter_model.safetensors"
    if (model_dir / "base" / "config.json").exists() and marker.exists():
        return
    if model_dir.exists():
        raise SystemExit(
            f"{model_dir} exists but lacks base/ or {num_adapters} adapters; remove it or pass another"
        )
    tmp = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"[adapter_memory] generating the {size} demo model + {num_adapters} adapters into {model_dir}",
        file=sys.stderr,
    )
    cmd = [
        sys.executable,
        "-m",
        "lorahost.cli",
        "demo-model",
        str(tmp),
        "--size",
        size,
        "--num-adapters",
        str(num_adapters),
    ]
    subprocess.run(cmd, check=True, cwd=str(REPO), stdout=sys.stderr)
    tmp.rename(model_dir)


def find_adapters(model_dir: Path, limit: int | None) -> dict[str, Path]:
    """name -> adapter dir under model_dir/adapters (sorted by name, at most `limit`)."""
    dirs = sorted(p for p in (model_dir / "adapters").iterdir() if (p / "adapter_model.safetensors").exists())
    if not dirs:
        raise SystemExit(f"no adapters under {model_dir / 'adapters'}")
    return {p.name: p for p in dirs[:limit]}


# ------------------------------------------------------------------------------------------ runs


def run_child(spec: dict, log_path: Path, timeout_s: float) -> dict:
    """Run one config in a fresh process (`--run-one`); its metrics plus foreign-load numbers."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, dir=log_path.parent) as f:
        json.dump(spec, f)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run-one", f.name]
    before = busy_cores(1.0)
    clock = ChildClock()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=str(REPO), env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        status, ru, timed_out = wait_with_timeout(proc, timeout_s)
    wall, foreign = clock.stop(ru)
    os.unlink(f.name)
    text = log_path.read_text(errors="replace")
    found = [ln[len("RESULT ") :] for ln in text.splitlines() if ln.startswith("RESULT ")]
    res = (
        json.loads(found[-1])
        if found
        else {
            "error": "timeout" if timed_out else f"exit code {os.waitstatus_to_exitcode(status)}",
            "log": str(log_path),
            "log_tail": text.strip().splitlines()[-12:],
        }
    )
    res["wall_s"] = round(wall, 2)
    res["foreign_busy_cores_before"] = round(before, 2)
    res["foreign_busy_cores_during"] = round(max(foreign, 0.0), 2)
    return res


class Bench:
    """One model's comparisons: workload, budget, child runs, result lines."""

    def __init__(self, args: argparse.Namespace, model_dir: Path, emit) -> None:
        self.args, self.model_dir, self.emit = args, model_dir, emit
        self.base = model_dir / "base"
        self.adapters = find_adapters(model_dir, args.num_adapters)
        self.log_dir = args.out.parent / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.lines: list[dict] = []
        self.fields = engine_config_fields()

    def prepare(self) -> None:
        """Build the workload (written once for the children) and size the memory budget."""
        from gpu_workers.engine.config import EngineConfig

        a = self.args
        spec = workload_spec(
            a, trace_path=a.trace, tokenizer_dir=self.base, adapters=tuple(self.adapters), rps=a.rps
        )
        reqs = build_workload(spec)
        self.workload = [
            {
                "index": r.index,
                "arrival_s": r.arrival_s,
                "adapter": r.adapter,
                "prompt_token_ids": r.prompt_token_ids,
                "output_tokens": r.output_tokens,
            }
            for r in reqs
        ]
        self.workload_shape = {k: v for k, v in summarize(reqs).items() if k != "adapter_counts"}
        import torch

        elem = torch.empty(
            (), dtype=EngineConfig(model_path=self.base, dtype=a.dtype).resolved_dtype()
        ).element_size()
        sizes = {
            n: adapter_device_bytes(p / "adapter_model.safetensors", elem) for n, p in self.adapters.items()
        }
        cfg = json.loads((self.base / "config.json").read_text())
        kv_tokens = a.kv_tokens or a.kv_concurrency * (a.max_prompt_tokens + a.max_output_tokens)
        self.budget = memory_budget(
            sizes, a.adapter_budget_fraction, kv_tokens, kv_bytes_per_token(cfg, elem)
        )
        self.engine_base = {
            "dtype": a.dtype,
            **({"num_threads": a.threads} if a.threads else {}),
            "adapter_cache_bytes": self.budget["adapter_budget_bytes"],
            "kv_cache_bytes": self.budget["kv_budget_bytes"],
            **json.loads(a.engine_args or "{}"),
        }
        self.emit(
            self._line(
                {
                    "metric": "memory_budget",
                    **self.budget,
                    "workload": self.workload_shape,
                    "engine_common": self.engine_base,
                }
            )
        )

    def _line(self, d: dict) -> dict:
        return {"benchmark": "adapter_memory", "model": str(self.model_dir), **d}

    def _spec(self, engine: dict, requests: list[dict], mode: str, tag: str) -> dict:
        path = self.log_dir / f"adapter_memory-workload-{tag}.json"
        path.write_text(json.dumps(requests))
        return {
            "mode": mode,
            "model_base": str(self.base),
            "adapters": {n: str(p) for n, p in self.adapters.items()},
            "workload_path": str(path),
            "engine": engine,
            "drain_s": self.args.drain_s,
        }

    def run(self, comparison: str, name: str, accepted: dict, dropped: dict, rate: float) -> dict:
        tag = f"{self.model_dir.name}-{comparison}-{name}-{rate:g}"
        engine = {**self.engine_base, **accepted}
        spec = self._spec(engine, at_rate(self.workload, self.args.rps, rate), "replay", tag)
        print(f"[adapter_memory] {comparison}/{name} at {rate:g} req/s", file=sys.stderr)
        res = run_child(spec, self.log_dir / f"adapter_memory-{tag}.log", self.args.timeout)
        line = self._line(
            {
                "comparison": comparison,
                "config": name,
                "rate_rps": rate,
                "overrides": accepted,
                **({"dropped_absent": dropped} if dropped else {}),
                **res,
            }
        )
        self.lines.append(line)
        self.emit(line)
        return line

    def calibrate(self, accepted: dict) -> float | None:
        """Unloaded mean TTFT (ms) with the given overrides; None when the run failed."""
        spec = self._spec(
            {**self.engine_base, **accepted}, self.workload, "calibrate", f"{self.model_dir.name}-cal"
        )
        res = run_child(
            spec, self.log_dir / f"adapter_memory-{self.model_dir.name}-calibrate.log", self.args.timeout
        )
        self.emit(
            self._line({"comparison": "split", "metric": "unloaded_ttft", "overrides": accepted, **res})
        )
        return res.get("unloaded_ttft_ms_mean")

    def comparison(self, comparison: str) -> None:
        target = None
        for name, overrides in comparison_configs(comparison, self.args.link_gbps):
            accepted, dropped, skip = resolve_overrides(overrides, self.fields)
            if skip:
                self.emit(
                    self._line(
                        {"comparison": comparison, "config": name, "overrides": overrides, "skipped": skip}
                    )
                )
                continue
            if comparison != "split":
                self.run(comparison, name, accepted, dropped, self.args.rps)
                continue
            if target is None:
                target = self.args.ttft_target_ms or None
                if target is None:
                    unloaded = self.calibrate(accepted)
                    target = 5.0 * unloaded if unloaded else float("inf")
            by_rate = {
                r: self.run(comparison, name, accepted, dropped, r)
                for r in sweep_rates(self.args.rps, self.args.rates)
            }
            line = self._line(
                {
                    "comparison": comparison,
                    "config": name,
                    "metric": "peak_rps_at_ttft_target",
                    "ttft_target_ms": round(target, 2),
                    "peak_rps": peak_rate(by_rate, target),
                    "ttft_ms_p99_by_rate": {str(r): x.get("ttft_ms_p99") for r, x in by_rate.items()},
                }
            )
            self.lines.append(line)
            self.emit(line)

    def summary(self) -> dict:
        return self._line(
            {
                "metric": "summary",
                "rps": self.args.rps,
                **summary_ratios(self.lines, self.args.rps),
                "budget": self.budget,
                "git": git_state(),
                "cpus": os.cpu_count(),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-one", help=argparse.SUPPRESS)
    p.add_argument(
        "--model-dir",
        type=Path,
        action="append",
        help="a dir with base/ and adapters/ (repeatable; default: the --size demo model, generated once)",
    )
    p.add_argument("--size", default="small", help="demo model size when no --model-dir (small | tiny)")
    p.add_argument("--num-adapters", type=int, default=100)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--rps", type=float, default=1.0, help="offered load of the policy/cpu_prefill runs")
    p.add_argument("--rates", default="", help="split sweep rates, comma list (default 1,1.5,2 x --rps)")
    p.add_argument("--comparisons", default=",".join(COMPARISONS))
    p.add_argument("--adapter-budget-fraction", type=float, default=0.2, help="of all adapters' device bytes")
    p.add_argument("--kv-concurrency", type=int, default=8, help="KV budget = this many max-length requests")
    p.add_argument(
        "--kv-tokens", type=int, default=0, help="KV budget in tokens (overrides --kv-concurrency)"
    )
    p.add_argument(
        "--link-gbps",
        type=float,
        default=2.0,
        help="emulated host->device link in GB/s (adapter_link_gbps; cpu_prefill comparison)",
    )
    p.add_argument("--ttft-target-ms", type=float, default=0.0, help="default: 5x the unloaded mean TTFT")
    add_workload_args(p, max_prompt_tokens=128, max_output_tokens=16, length_scale=0.125)
    p.add_argument("--seed", type=int, default=0)
    add_dtype_arg(p)
    p.add_argument(
        "--threads", type=int, default=1, help="engine num_threads (0: torch default; 1 resists foreign load)"
    )
    p.add_argument("--engine-args", default="", help="extra EngineConfig kwargs for every config, as JSON")
    p.add_argument(
        "--drain-s", type=float, default=60.0, help="abort what still runs this long after the last arrival"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per config process")
    p.add_argument("--quick", action="store_true", help="smoke run: 16 requests, one split rate")
    p.add_argument("--out", type=Path, default=HERE / "results" / "adapter_memory.jsonl")
    args = p.parse_args(argv)
    if args.quick:
        args.num_requests = min(args.num_requests, 16)
        args.rates = args.rates or f"{args.rps:g}"
        args.drain_s = min(args.drain_s, 30.0)
    for c in args.comparisons.split(","):
        if c.strip() and c.strip() not in COMPARISONS:
            p.error(f"unknown comparison {c!r}; choose from {', '.join(COMPARISONS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_one:
        return run_one(args.run_one)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def emit(line: dict) -> None:
        text = json.dumps(line)
        print(text, flush=True)
        with open(args.out, "a") as f:
            f.write(text + "\n")

    model_dirs = args.model_dir or [Path(f"~/.cache/lorahost/bench-{args.size}-{args.num_adapters}")]
    failed = False
    for model_dir in model_dirs:
        model_dir = model_dir.expanduser().resolve()
        if not args.model_dir:
            ensure_model(model_dir, args.size, args.num_adapters)
        bench = Bench(args, model_dir, emit)
        bench.prepare()
        for comparison in [c.strip() for c in args.comparisons.split(",") if c.strip()]:
            bench.comparison(comparison)
        emit(bench.summary())
        failed = failed or any("error" in x for x in bench.lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
