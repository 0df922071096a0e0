"""Fair share between tenants: a well-behaved tenant's TTFT while another tenant floods the same engine.

Tenant b sends `--rate` requests/s (Poisson), tenant a `--flood-factor` times as many; both send
`--prompt-tokens` prompts for `--max-tokens` tokens (ignore_eos) to one native engine (the demo model; a
dir with base/ and adapters/ made by `lorahost demo-model`, generated when missing). Cases:
  alone       b alone (its TTFT without contention),
  fifo        b + a's flood, admission by the batch policy alone (LORAHOST_ENGINE_FAIR_SHARE=false),
  fair_share  b + a's flood, with the tenants' fair share (scheduler/admission/fair_share.py, the default).
Open loop: requests are added at their scheduled time by the thread that steps the engine (as the worker's
loop does); TTFT = the step that returns the first token - the scheduled arrival. Each case runs
`--duration-s` of arrivals, then the rest of a's queue is aborted once every b request has its first token.

    PYTHONPATH=. .venv/bin/python benchmarks/fairness.py --model-dir ~/.cache/lorahost/bench-tiny-16

Output: one JSON line per case (b's P50/P99 TTFT in ms and its ratio to alone; b's P50/P99 engine steps from
its arrival to its first token, which do not depend on how loaded the machine is; a's queue at the end; the
mean step time), then a summary line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_dtype import add_dtype_arg
from benchmarks.model_dirs import ensure_model
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams


@dataclass(frozen=True)
class Arrival:
    """One scheduled request."""

    at_s: float
    tenant: str
    request_id: str


def schedule(
    rate: float, flood_factor: float, duration_s: float, is_flooded: bool, seed: int
) -> list[Arrival]:
    """Poisson arrivals of b at `rate` and (when flooded) of a at `rate * flood_factor`, by time."""
    rng = random.Random(seed)
    arrivals = []
    tenants = [("b", rate)] + ([("a", rate * flood_factor)] if is_flooded else [])
    for tenant, tenant_rate in tenants:
        at_s, i = rng.expovariate(tenant_rate), 0
        while at_s < duration_s:
            arrivals.append(Arrival(at_s, tenant, f"{tenant}{i}"))
            at_s += rng.expovariate(tenant_rate)
            i += 1
    return sorted(arrivals, key=lambda a: a.at_s)


def run_case(engine: LLMEngine, arrivals: list[Arrival], prompt: list[int], params: SamplingParams) -> dict:
    """b's TTFTs (seconds) and a's queue left when the last b request got its first token."""
    ttft: dict[str, float] = {}
    added_at_step: dict[str, int] = {}
    steps_to_first: list[int] = []
    num_steps = 0
    num_b = sum(a.tenant == "b" for a in arrivals)
    start = time.perf_counter()
    pending = list(arrivals)
    arrival_of = {a.request_id: a for a in arrivals}
    while pending or len(ttft) < num_b:
        now = time.perf_counter() - start
        while pending and pending[0].at_s <= now:
            a = pending.pop(0)
            engine.add_request(EngineRequest(a.request_id, prompt, params, tenant_id=a.tenant))
            added_at_step[a.request_id] = num_steps
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(0.01, pending[0].at_s - now)) if pending else 0.0)
            continue
        outputs = engine.step()
        num_steps += 1
        for out in outputs:
            arrival = arrival_of[out.request_id]
            if arrival.tenant == "b" and out.new_token_ids and out.request_id not in ttft:
                ttft[out.request_id] = time.perf_counter() - start - arrival.at_s
                steps_to_first.append(num_steps - added_at_step[out.request_id])
    num_waiting = engine.engine_stats().num_waiting
    num_a_left = sum(1 for a in arrivals if a.tenant == "a" and engine.abort(a.request_id))
    while engine.has_unfinished_requests():
        engine.step()
    elapsed_s = time.perf_counter() - start
    return {
        "ttft": sorted(ttft.values()),
        "steps_to_first": sorted(steps_to_first),
        "num_a_left": num_a_left,
        "num_waiting_at_end": num_waiting,
        "mean_step_ms": 1000 * elapsed_s / max(1, num_steps),
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of sorted values."""
    return values[min(len(values) - 1, max(0, round(q / 100 * len(values) + 0.5) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=Path.home() / ".cache/lorahost/bench-tiny-16")
    parser.add_argument("--size", default="tiny", help="demo model size when the dir must be generated")
    parser.add_argument("--rate", type=float, default=1.2, help="tenant b's requests per second")
    parser.add_argument("--flood-factor", type=float, default=10.0, help="tenant a's rate / b's rate")
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--batch-policy", default="fifo")
    add_dtype_arg(parser)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ensure_model(args.model_dir, sys.executable, 1, args.size)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    prompt = [(7 * i) % 200 + 4 for i in range(args.prompt_tokens)]
    cases = {"alone": (False, True), "fifo": (True, False), "fair_share": (True, True)}
    results = {}
    for case, (is_flooded, is_fair) in cases.items():
        config = EngineConfig(
            model_path=args.model_dir / "base",
            dtype=args.dtype,
            max_num_seqs=args.max_num_seqs,
            batch_policy=args.batch_policy,
            fair_share=is_fair,
            num_threads=args.num_threads,
            enable_prefix_caching=False,  # every request has the same prompt: measure queueing, not cache hits
        )
        engine = LLMEngine(config)
        engine.generate([prompt], params)  # warm up
        arrivals = schedule(args.rate, args.flood_factor, args.duration_s, is_flooded, args.seed)
        outcome = run_case(engine, arrivals, prompt, params)
        ttft = outcome["ttft"]
        results[case] = {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99)}
        line = {
            "case": case,
            "num_b_requests": len(ttft),
            "b_ttft_p50_ms": round(1000 * results[case]["p50"], 1),
            "b_ttft_p99_ms": round(1000 * results[case]["p99"], 1),
            "b_ttft_mean_ms": round(1000 * statistics.fmean(ttft), 1),
            "num_a_left": outcome["num_a_left"],
            "num_waiting_at_end": outcome["num_waiting_at_end"],
            "b_steps_to_first_token_p50": percentile(outcome["steps_to_first"], 50),
            "b_steps_to_first_token_p99": percentile(outcome["steps_to_first"], 99),
            "mean_step_ms": round(outcome["mean_step_ms"], 1),
        }
        if case != "alone":
            line["p50_ratio_to_alone"] = round(results[case]["p50"] / results["alone"]["p50"], 2)
            line["p99_ratio_to_alone"] = round(results[case]["p99"] / results["alone"]["p99"], 2)
        print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {
                "summary": "fairness",
                "rate_b": args.rate,
                "rate_a": args.rate * args.flood_factor,
                "max_num_seqs": args.max_num_seqs,
                "prompt_tokens": args.prompt_tokens,
                "max_tokens": args.max_tokens,
                "batch_policy": args.batch_policy,
                "dtype": args.dtype,
                "fair_share_p99_ratio": round(results["fair_share"]["p99"] / results["alone"]["p99"], 2),
                "fifo_p99_ratio": round(results["fifo"]["p99"] / results["alone"]["p99"], 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
