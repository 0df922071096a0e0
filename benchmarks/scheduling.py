"""Scheduling: batch policies (FIFO, SJF, multi-queue, ...) with and without the adapter cache, on the real
engine, swept from light load to overload.

Workload (benchmarks/scheduling_workload.py): 100 demo adapters of ranks 8..128 on the `small` model,
Zipf popularity, prompt lengths from the Azure conv trace scaled to the model, Poisson arrivals, and a
per-adapter log-normal output-length distribution (medians drawn from the trace's output lengths, scaled).
Every request carries the prediction of a LengthPredictor trained on a separate history drawn from the
same distributions (held-out MAE and bucket accuracy are reported); the engine only sees the prediction and
the API cap, and the replay stops each request at its true length.

Systems, side by side in one run, each (system, load) in its own process (benchmarks/adapter_memory.py's
child runner and open-loop replay): every name of --policies registered in scheduler/admission/batch_policy.py
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))  # this tree's scheduler/, not an installed copy

from adapter_memory import ensure_model
from bench_dtype import add_dtype_arg
from run_info import git_state
from scheduling_bench import SchedulingBench, log
from scheduling_metrics import report_text, summarize_systems
from workload_args import add_workload_args

from scheduler.admission.batch_policy import BATCH_POLICIES

DEFAULT_LOADS = "0.3,0.6,0.8,1.0,1.2,1.5"
DEFAULT_POLICIES = "fifo,sjf,multiqueue"


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
    add_dtype_arg(p)
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
