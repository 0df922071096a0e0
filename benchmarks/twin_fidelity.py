"""How faithful is the digital twin? Replay the same trace with the same settings on the real engine and in the
worker twin (twin/worker_sim.py: the engine's own core over a simulated executor priced by a profile
of this engine), and print SMAPE of throughput, TTFT p50/p99, ITL p50/p99 and queueing time, plus the twin's
simulated seconds per wall second (issue 22 item 4; the paper's twin: 1-5% throughput, 12-21% TTFT, 3.5-9.9%
ITL, ../shared/papers/digital_twin.md).

    .venv/bin/python benchmarks/twin_fidelity.py --model-dir ~/.cache/lorahost/bench-smollm2-100 \\
        --profile /tmp/smollm2-twin.json --threads 2 --output benchmarks/results/twin_fidelity.json

The profile is measured on the same engine first (`lorahost profile --twin-output --prompt-tokens
16,128,<max prompt>`, run here when --profile names a missing file: prompts as long as the trace's, or the
prefill cost is extrapolated). Grid (each axis a comma-separated option): traces `conv` (../shared/data Azure
conversation lengths, inputs <= --max-prompt, outputs <= --max-output) and `long` (synthetic long inputs,
short outputs); loads as fractions of the twin's own saturated throughput (so 1.2 is overload); batch
policies; memory modes; adapter counts; and `slot` (the default KV pool, bound by max_num_seqs) beside
`memory` (a small KV pool and many sequence slots). Arrivals are Poisson at the load's rate, adapters Zipf(1).
The real engine is driven in real time by one thread (add the requests that have arrived, step, record each
token's time) with an injected clock that starts at 0, like the twin's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_dtype import add_dtype_arg
from benchmarks.run_info import cpu_model
from benchmarks.serving_workload import read_trace, zipf_weights
from scheduler.core.engine_request import EngineRequest
from twin.request_record import RequestRecord
from twin.run_metrics import COMPARED, RunSummary, compare, median_summary, spread_pct, summarize
from twin.trace import AdapterSpec, TraceRequest

CONV_TRACE = REPO.parent / "shared" / "data" / "azure_llm_2023_conv.csv"  # ../shared/data beside the checkout


@dataclass(frozen=True)
class Case:
    """One point of the grid."""

    trace: str
    load: float
    policy: str
    memory_mode: str
    num_adapters: int
    bound: str  # "slot" | "memory"

    @property
    def name(self) -> str:
        return (
            f"{self.trace}/{self.bound}/{self.memory_mode}/{self.policy}/a{self.num_adapters}/x{self.load:g}"
        )


def _csv(text: str, kind: type = str) -> list[Any]:
    return [kind(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True, help="base/ + adapters/adapter-NN (PEFT)")
    p.add_argument(
        "--profile", type=Path, required=True, help="twin profile of this engine (made if missing)"
    )
    p.add_argument("--traces", default="conv,long")
    p.add_argument("--conv-trace", type=Path, default=CONV_TRACE, help="the Azure conversation trace CSV")
    p.add_argument("--loads", default="0.5,0.9,1.2", help="fractions of the twin's saturated throughput")
    p.add_argument("--policies", default="fifo,multiqueue")
    p.add_argument("--memory-modes", default="unified,static")
    p.add_argument("--num-adapters", default="16,100")
    p.add_argument("--bounds", default="slot,memory")
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--max-output", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=32, help="slot-bound cases (memory-bound: 4x)")
    p.add_argument("--memory-kv-blocks", type=int, default=192, help="KV blocks of the memory-bound cases")
    p.add_argument("--threads", type=int, default=2)
    add_dtype_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--twin-only", action="store_true", help="skip the real engine (the twin's side only)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="real-engine runs per case, each on a fresh engine; the twin is scored against their median",
    )
    p.add_argument(
        "--compare-profile", type=Path, default=None, help="also price each trace with this profile"
    )
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    return args


# ---- workload ---------------------------------------------------------------------------------------


def lengths(
    trace: str, n: int, max_prompt: int, max_output: int, seed: int, conv_trace: Path = CONV_TRACE
) -> list[tuple[int, int]]:
    """(prompt, output) lengths of n requests: the conversation trace's (clipped), or synthetic long inputs."""
    rng = random.Random(seed)
    if trace == "conv":
        rows = read_trace(conv_trace)
        start = rng.randrange(0, len(rows) - n)
        return [
            (min(max(c, 8), max_prompt), min(max(g, 1), max_output)) for _, c, g in rows[start : start + n]
        ]
    if trace == "long":
        return [
            (rng.randint(max_prompt // 2, max_prompt), rng.randint(4, max(4, max_output // 4)))
            for _ in range(n)
        ]
    raise SystemExit(f"unknown trace {trace!r} (conv | long)")


def make_trace(
    sizes: list[tuple[int, int]], adapters: list[str], rate: float, seed: int
) -> list[TraceRequest]:
    """Poisson arrivals at `rate` per second, Zipf(1) adapters (every request names one)."""
    rng = random.Random(seed + 1)
    weights = zipf_weights(len(adapters), 1.0)
    t, out = 0.0, []
    for i, (num_prompt, num_output) in enumerate(sizes):
        t += rng.expovariate(rate)
        adapter = rng.choices(adapters, weights)[0]
        out.append(TraceRequest(f"r{i}", t, num_prompt, num_output, adapter_id=adapter, tenant_id="t0"))
    return out


# ---- the two systems --------------------------------------------------------------------------------


def engine_config(args: argparse.Namespace, case: Case) -> Any:
    from gpu_workers.engine.config import EngineConfig

    memory_bound = case.bound == "memory"
    return EngineConfig(
        model_path=args.model_dir / "base",
        dtype=args.dtype,
        num_threads=args.threads,
        memory_mode=case.memory_mode,
        batch_policy=case.policy,
        max_num_seqs=args.max_num_seqs * (4 if memory_bound else 1),
        num_kv_blocks=args.memory_kv_blocks if memory_bound else None,
        max_lora_rank=128,
        enable_prefix_caching=False,
    )


class RelativeClock:
    """Wall seconds since the run started: the real engine's injected clock, so its times match the twin's."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def warm_up(engine: Any, trace: list[TraceRequest], vocab: int) -> None:
    """Run the trace's prompt lengths once through the base model (up to 16 at once) before
    the timed replay: a GPU's first steps at new shapes pay one-time costs (kernel selection, allocator growth:
    508 ms TTFT p50 in an H200's first case against 68 ms after) that no profile step has. The trace's adapters
    stay cold (no adapter is used), and nothing of it lands in the records."""
    from scheduler.core.sampling import SamplingParams

    rng = random.Random(11)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    lengths = sorted({r.num_prompt_tokens for r in trace})
    for i in range(min(engine.config.max_num_seqs, 16)):
        prompt = [rng.randrange(10, vocab) for _ in range(lengths[(i * 7) % len(lengths)])]
        engine.add_request(EngineRequest(f"warm-up-{i}", prompt, params))
    while engine.has_unfinished_requests():
        engine.step()


def run_real(engine: Any, clock: RelativeClock, trace: list[TraceRequest], vocab: int) -> list[RequestRecord]:
    """Replay in real time: add the requests that have arrived, step, record each token's time."""
    from scheduler.core.sampling import SamplingParams

    clock.start = time.perf_counter()
    pending = deque(sorted(trace, key=lambda r: r.arrival_s))
    records: dict[str, RequestRecord] = {}
    rng = random.Random(7)
    while pending or engine.has_unfinished_requests():
        now = clock()
        while pending and pending[0].arrival_s <= now:
            r = pending.popleft()
            prompt = [rng.randrange(10, vocab) for _ in range(r.num_prompt_tokens)]
            params = SamplingParams(max_tokens=r.num_output_tokens, temperature=0.0, ignore_eos=True)
            engine.add_request(
                EngineRequest(
                    r.request_id,
                    prompt,
                    params,
                    r.adapter_id,
                    arrival_time=r.arrival_s,
                    tenant_id=r.tenant_id,
                )
            )
            records[r.request_id] = RequestRecord(
                r.request_id, r.arrival_s, r.num_prompt_tokens, r.adapter_id, r.tenant_id
            )
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].arrival_s - clock()))
            continue
        for out in engine.step():
            record = records[out.request_id]
            record.token_times.extend([clock()] * len(out.new_token_ids))
            record.first_scheduled_s = out.first_scheduled_time
            if out.is_finished:
                record.finish_s, record.finish_reason = out.finish_time, out.finish_reason
    return [records[r.request_id] for r in trace]


def adapter_specs(engine: Any, names: list[str]) -> list[AdapterSpec]:
    """The adapters as the real engine registered them (rank, device bytes, exact pages)."""
    specs = []
    for name in names:
        state = engine.residency.get(name)
        specs.append(AdapterSpec(name, state.rank, state.num_bytes, state.num_pages))
    return specs


def run_twin(
    config: Any, geometry: Any, profile: Any, adapters: list[AdapterSpec], trace: list[TraceRequest]
) -> tuple[list[RequestRecord], float]:
    """The worker twin with the engine's own settings and geometry; returns the records and wall seconds."""
    from twin.cost_model import CostModel
    from twin.worker_sim import SimulatedWorker

    started = time.perf_counter()
    worker = SimulatedWorker(
        config, geometry, CostModel(profile), adapters, max_lora_rank=config.max_lora_rank
    )
    records = worker.run(trace)
    return records, time.perf_counter() - started


def saturated_rate(
    config: Any,
    geometry: Any,
    profile: Any,
    adapters: list[AdapterSpec],
    sizes: list[tuple[int, int]],
    names: list[str],
    seed: int,
) -> float:
    """Requests per second the twin completes when everything arrives at once (the load's unit)."""
    burst = [
        TraceRequest(r.request_id, 0.0, r.num_prompt_tokens, r.num_output_tokens, r.adapter_id, r.tenant_id)
        for r in make_trace(sizes, names, 1.0, seed)
    ]
    records, _ = run_twin(config, geometry, profile, adapters, burst)
    summary = summarize(records)
    return summary.num_finished / summary.duration_s


# ---- main -------------------------------------------------------------------------------------------


def ensure_profile(args: argparse.Namespace) -> None:
    if args.profile.exists():
        return
    print(f"[twin_fidelity] measuring the twin profile into {args.profile}", file=sys.stderr)
    env = {
        **os.environ,
        "LORAHOST_ENGINE_NUM_THREADS": str(args.threads),
        "LORAHOST_ENGINE_DTYPE": args.dtype,
    }
    subprocess.run(
        [sys.executable, "-m", "lorahost.cli", "profile", "--base-model", str(args.model_dir / "base"),
         "--output", str(args.profile.with_suffix(".router.json")), "--twin-output", str(args.profile),
         "--prompt-tokens", f"16,128,{args.max_prompt}"],
        check=True, cwd=str(REPO), stdout=sys.stderr, env=env,
    )  # fmt: skip


def set_up_case(
    args: argparse.Namespace, case: Case, profile: Any, all_names: list[str]
) -> tuple[Any, RelativeClock, list[AdapterSpec], float, list[TraceRequest]]:
    """A fresh engine for `case` (cold adapters, empty queues, its clock), its adapters as registered, the
    twin's saturated rate (requests/s) and the case's trace at `case.load` of it."""
    from gpu_workers.engine.llm_engine import LLMEngine

    names = all_names[: case.num_adapters]
    if len(names) < case.num_adapters:
        raise SystemExit(
            f"{args.model_dir} has {len(all_names)} adapters; the case needs {case.num_adapters}"
        )
    config = engine_config(args, case)
    clock = RelativeClock()
    engine = LLMEngine(config, clock=clock)
    for name in names:
        engine.register_adapter(name, args.model_dir / "adapters" / name)
    geometry = engine.runner.geometry
    adapters = adapter_specs(engine, names)
    max_prompt = min(args.max_prompt, geometry.max_model_len // 2)
    sizes = lengths(case.trace, args.num_requests, max_prompt, args.max_output, args.seed, args.conv_trace)
    capacity = saturated_rate(config, geometry, profile, adapters, sizes, names, args.seed)
    return engine, clock, adapters, capacity, make_trace(sizes, names, case.load * capacity, args.seed)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from twin.profile import load_profile

    torch.set_num_threads(args.threads)
    ensure_profile(args)
    profile = load_profile(args.profile)
    all_names = sorted(p.name for p in (args.model_dir / "adapters").iterdir() if p.is_dir())
    cases = [
        Case(t, load, pol, mem, n, bound)
        for t, bound, mem, pol, n, load in itertools.product(
            _csv(args.traces), _csv(args.bounds), _csv(args.memory_modes), _csv(args.policies),
            _csv(args.num_adapters, int), _csv(args.loads, float),
        )
    ]  # fmt: skip
    rows = []
    for case in cases:
        engine, clock, adapters, capacity, trace = set_up_case(args, case, profile, all_names)
        config, geometry = engine.config, engine.runner.geometry
        twin_records, twin_wall = run_twin(config, geometry, profile, adapters, trace)
        twin = summarize(twin_records)
        row: dict[str, Any] = {
            "case": case.name,
            "rate_rps": case.load * capacity,
            "twin": twin.as_dict(),
            "twin_sim_s_per_wall_s": twin.duration_s / max(twin_wall, 1e-9),
        }
        if not args.twin_only:
            runs = []
            for repeat in range(args.repeats):
                if repeat > 0:  # a fresh engine: cold adapters and empty caches again
                    del engine
                    engine, clock, _, _, _ = set_up_case(args, case, profile, all_names)
                vocab = engine.runner.args.vocab_size
                warm_up(engine, trace, vocab)
                runs.append(summarize(run_real(engine, clock, trace, vocab)))
            real = median_summary(runs)
            row["real"] = real.as_dict()
            row["real_runs"] = [run.as_dict() for run in runs]
            row["real_spread_pct"] = spread_pct(runs)
            row["smape_pct"] = compare(real, twin)
            row["smape_per_run_pct"] = [compare(run, twin) for run in runs]
            if args.compare_profile is not None:  # another twin on the same trace against the same run
                other, _ = run_twin(config, geometry, load_profile(args.compare_profile), adapters, trace)
                row["smape_compare_pct"] = compare(real, summarize(other))
        del engine
        rows.append(row)
        print(_line(row), flush=True)
    print(_table(rows))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "cpu": cpu_model(),
            "torch_threads": args.threads,
            "profile": str(args.profile),
            "compare_profile": str(args.compare_profile),
            "num_requests": args.num_requests,
            "repeats": args.repeats,
        }
        args.output.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


def _line(row: dict[str, Any]) -> str:
    twin = RunSummary(**{k: row["twin"][k] for k in RunSummary.__dataclass_fields__})  # type: ignore[arg-type]
    text = f"{row['case']:<44} rate {row['rate_rps']:.2f}/s twin thr {twin.throughput_tok_s:7.1f} tok/s ttft50 {twin.ttft_p50_s * 1000:7.0f} ms"
    if "smape_pct" in row:
        s = row["smape_pct"]
        text += " | SMAPE " + " ".join(
            f"{m.split('_')[0]}{'' if m.startswith('throughput') else m.split('_')[1]} {s[m]:.1f}%"
            for m in COMPARED
        )
    if len(row.get("real_runs", ())) > 1:
        spread = row["real_spread_pct"]
        text += f" | real spread ({len(row['real_runs'])} runs) ttft50 {spread['ttft_p50_s']:.0f}% itl50 {spread['itl_p50_s']:.0f}%"
    return text + f" | sim/wall {row['twin_sim_s_per_wall_s']:.0f}x"


def _table(rows: list[dict[str, Any]]) -> str:
    with_real = [r for r in rows if "smape_pct" in r]
    if not with_real:
        return ""
    lines = []
    is_repeated = len(with_real[0]["real_runs"]) > 1
    for key in ("smape_pct", "smape_compare_pct", "real_spread_pct"):
        if key in with_real[0] and (is_repeated or key != "real_spread_pct"):
            mean = {m: sum(r[key][m] for r in with_real) / len(with_real) for m in COMPARED}
            lines.append(
                f"mean {key} over {len(with_real)} cases: "
                + ", ".join(f"{m} {v:.1f}%" for m, v in mean.items())
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
