"""How fast the cluster twin runs (issue 36 item 3): N simulated workers for T simulated seconds at a stated
load, on the H100 Llama-3.1-8B profile by default; prints one JSON line with simulated seconds per wall second
and per CPU second (`time.process_time`, since the machine may be shared), engine steps per second and the load
average, and with `--profile` the top functions of a cProfile run (where the time goes).

Workload: conversation-trace lengths (../shared/data/azure_llm_2023_conv.csv rows drawn with replacement,
outputs <= 512), `--num-adapters` adapters of ranks 8..128 with Zipf(1) popularity, Poisson arrivals at
`--load` x (one worker's saturated request rate) x workers; the loraserve section's engine settings
(max_num_seqs 128, no CPU-assisted prefill, no prefix caching, no fair share), residency-least-loaded routing,
no placement job, no autoscaling, a 50 ms adapter fetch.

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/twin_speed.py                 # one hour, 16 workers
    .venv/bin/python benchmarks/twin_speed.py --quick --profile                                 # 60 s, with cProfile
    .venv/bin/python benchmarks/twin_speed.py --num-scheduler-steps 1                           # single-step core
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.run_info import cpu_model
from benchmarks.twin_loraserve import LORASERVE_RANKS
from benchmarks.twin_papers import (
    CONV_TRACE,
    DEFAULT_PROFILE,
    _rows,
    make_adapters,
    poisson_trace,
    rank_mix,
    saturated_rps,
)
from settings import Settings
from settings.engine import EngineSettings
from twin.cluster_run import ClusterOptions
from twin.cluster_sim import ClusterSim
from twin.cost_model import CostModel
from twin.profile import TwinProfile, load_profile
from twin.trace import TraceRequest
from twin.worker_sim import TWIN_SCHEDULER_STEPS


def lengths(num: int, seed: int, max_output: int = 512) -> list[tuple[int, int]]:
    """`num` (prompt, output) lengths drawn with replacement from the conversation trace (seeded)."""
    rows = _rows(CONV_TRACE)
    rng = random.Random(seed + 5)
    picks = (rows[rng.randrange(len(rows))] for _ in range(num))
    return [(min(max(c, 8), 3072), min(max(g, 1), max_output)) for _, c, g in picks]


def engine_fields(num_scheduler_steps: int | None) -> dict[str, Any]:
    """The engine settings of the run (flat names; num_scheduler_steps None: the setting's default)."""
    flat: dict[str, Any] = {
        "max_num_seqs": 128, "cpu_prefill_workers": 0, "enable_prefix_caching": False, "fair_share": False,
    }  # fmt: skip
    if num_scheduler_steps is not None:
        flat["num_scheduler_steps"] = num_scheduler_steps
    return flat


def make_trace(
    profile: TwinProfile, args: argparse.Namespace, engine: EngineSettings
) -> tuple[list[TraceRequest], float, list[Any]]:
    """The run's trace, its arrival rate (req/s) and adapters."""
    adapters = make_adapters(profile, rank_mix(args.num_adapters, LORASERVE_RANKS, args.seed))
    ids = [a.adapter_id for a in adapters]
    sample = poisson_trace(lengths(400, args.seed), ids, 1.0, args.seed)
    one = saturated_rps(profile, engine, adapters, sample)
    rate = args.load * one * args.workers
    num = int(rate * args.sim_seconds)
    trace = poisson_trace(lengths(num, args.seed), ids, rate, args.seed)
    return [r for r in trace if r.arrival_s < args.sim_seconds], rate, adapters


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One timed cluster-twin run; the JSON result."""
    profile = load_profile(args.profile)
    flat = {f"engine_{k}": v for k, v in engine_fields(args.num_scheduler_steps).items()}
    settings = Settings(
        **flat, router_policy="residency_least_loaded", placement_interval_s=0
    )  # fmt: skip
    trace, rate, adapters = make_trace(profile, args, settings.engine)
    options = ClusterOptions(num_initial_workers=args.workers, is_autoscaling=False, adapter_fetch_s=0.05)
    cost = CostModel(profile)
    engine = settings.engine
    geometry = profile.geometry(
        engine.memory_mode,
        adapter_cache_bytes=engine.adapter_cache_bytes,
        max_lora_rank=settings.resolved_max_lora_rank(),
        max_model_len=engine.max_model_len,
    )
    sim = ClusterSim(settings, geometry, cost, adapters, options)
    profiler = cProfile.Profile() if args.profile_out else None
    wall, cpu = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    result = sim.run(trace)
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    num_steps = sum(n.sim.executor.num_steps for n in sim.nodes.values())
    num_plans = num_steps - sum(n.sim.core.scheduler.window.num_window_steps for n in sim.nodes.values())
    num_tokens = sum(r.num_output_tokens for r in result.records)
    out = {
        "bench": "twin_speed",
        "profile": Path(args.profile).name,
        "workers": args.workers,
        "load": args.load,
        "rate_rps": round(rate, 2),
        "num_requests": len(trace),
        "num_output_tokens": num_tokens,
        "num_scheduler_steps": max(engine.num_scheduler_steps, TWIN_SCHEDULER_STEPS),
        "simulated_s": round(result.simulated_s, 1),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "sim_s_per_wall_s": round(result.simulated_s / wall, 1),
        "sim_s_per_cpu_s": round(result.simulated_s / cpu, 1),
        "engine_steps": num_steps,
        "core_plans": num_plans,
        "engine_steps_per_cpu_s": round(num_steps / cpu),
        "us_per_engine_step": round(cpu / max(num_steps, 1) * 1e6, 1),
        "records_sha256": records_digest(result.records),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpu": cpu_model(),
    }
    if profiler is not None:
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(args.profile_top)
        Path(args.profile_out).write_text(stream.getvalue())
        profiler.dump_stats(str(args.profile_out) + ".pstats")
    return out


def records_digest(records: list[Any]) -> str:
    """sha256 over every record's worker, token times, first-scheduled time, finish time and reason (equal
    digests: the same simulation, e.g. before and after a speed change)."""
    digest = hashlib.sha256()
    for r in records:
        fields = (r.request_id, r.worker_id, r.token_times, r.first_scheduled_s, r.finish_s, r.finish_reason)
        digest.update(repr(fields).encode())
    return digest.hexdigest()[:16]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module doc)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--sim-seconds", type=float, default=3600.0)
    p.add_argument("--load", type=float, default=0.5, help="x one worker's saturated rate x workers")
    p.add_argument("--num-adapters", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-scheduler-steps", type=int, default=None, help="default: the engine setting's")
    p.add_argument("--quick", action="store_true", help="60 simulated seconds")
    p.add_argument("--profile-out", type=Path, default=None, help="write cProfile's top functions here")
    p.add_argument("--profile-top", type=int, default=40)
    args = p.parse_args(argv)
    if args.quick:
        args.sim_seconds = min(args.sim_seconds, 60.0)
    return args


if __name__ == "__main__":
    print(json.dumps(run(parse_args())), flush=True)
