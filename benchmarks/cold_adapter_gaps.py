"""Running streams' inter-token gaps while cold adapters load (issue 35: no gap above two decode steps).

On the native engine: `--num-running` base-model streams decode (greedy, ignore_eos) until every one has its
first token; after `--baseline-steps` / 2 warm-up steps, `--baseline-steps` steps measure the decode step
alone (`decode_step_ms`, the median).
Then `--num-cold` requests arrive at once, each naming its own cold adapter of rank `--rank` (only registered
on the host: validated, nothing on the device, as the worker leaves it), with a `--cold-prompt-tokens`
prompt and `--cold-output-tokens` tokens. The engine steps until every cold request finished; a running
stream's gap is the time between two of its tokens (each stamped when its step returned). Reported: the
largest gap of any running stream in that window (`max_gap_ms`, and `max_gap_steps` = max_gap_ms /
decode_step_ms), the gaps' median and the largest gap over it (`max_gap_vs_median_gap`: a stall against the
steps of the same window, robust to a machine whose load changes between the baseline and the window), the
longest step, the cold requests' TTFT, and the engine's adapter preparation counters (absent on engines that
have none). On a CPU engine the preparation shares the cores with the steps, so steps run slower while
adapters are prepared even though none waits for one.

The adapters are generated once (seeded PEFT adapters over `--target-modules`, rank `--rank`) into
`--adapters-dir` (default MODEL_DIR/cold-r<rank>). Any engine tree can run this script: to compare an older
commit, export it and run this file with PYTHONPATH pointing at that tree (the summary names the commit).

    python benchmarks/engine_workload.py smollm2 ~/.cache/lorahost/bench-smollm2-0 --num-adapters 0
    PYTHONPATH=. .venv/bin/python benchmarks/cold_adapter_gaps.py --model-dir ~/.cache/lorahost/bench-smollm2-0

Output: one JSON line per run (`--runs`), then a summary line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_dtype import add_dtype_arg
from benchmarks.run_info import cpu_model, git_state
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams

ALL_MODULES = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
PREPARATION_FIELDS = (
    "num_adapter_preparations",
    "adapter_prepare_seconds_total",
    "adapter_prepare_seconds_max",
)


def ensure_cold_adapters(
    base_dir: Path, out_dir: Path, num: int, rank: int, modules: tuple[str, ...]
) -> list[Path]:
    """cold-00 .. cold-<num-1> under out_dir: seeded rank-`rank` PEFT adapters (written once)."""
    from gpu_workers.engine.demo_model import generate_adapter

    paths = []
    for i in range(num):
        path = out_dir / f"cold-{i:02d}"
        if not (path / "adapter_model.safetensors").is_file():
            generate_adapter(base_dir, path, rank=rank, target_modules=modules, seed=9000 + i)
        paths.append(path)
    return paths


def token_gaps(stamps: dict[str, list[float]], start: float, end: float) -> list[float]:
    """Gaps (seconds) between consecutive token stamps of each stream, of the tokens in [start, end] (the
    first such token's gap is measured from the stream's token before it)."""
    gaps = []
    for times in stamps.values():
        gaps += [b - a for a, b in itertools.pairwise(times) if start <= b <= end]
    return gaps


def run_once(args: argparse.Namespace, cold_dirs: list[Path], run: int) -> dict[str, Any]:
    """One engine, one measurement (module doc)."""
    config = EngineConfig(
        model_path=args.model_dir / "base",
        dtype=args.dtype,
        kv_cache_bytes=args.kv_cache_gib << 30,
        num_threads=args.num_threads,
        enable_prefix_caching=False,
        cpu_prefill_workers=args.cpu_prefill_workers,
        max_lora_rank=max(args.rank, 8),
        max_num_seqs=args.num_running + args.num_cold,
        max_running_adapter_mib=args.max_running_adapter_mib,
    )
    engine = LLMEngine(config)
    cold_ids = [f"cold-{run}-{i}" for i in range(len(cold_dirs))]
    for cold_id, path in zip(cold_ids, cold_dirs):
        engine.register_adapter(cold_id, path)
    vocab = engine.runner.args.vocab_size
    long = SamplingParams(max_tokens=100_000, temperature=0, ignore_eos=True)
    stamps: dict[str, list[float]] = {f"running-{i}": [] for i in range(args.num_running)}
    for i, request_id in enumerate(stamps):
        prompt = [7 + (i * 131 + j * 17) % (vocab - 7) for j in range(args.running_prompt_tokens)]
        engine.add_request(EngineRequest(request_id, prompt, long))

    def step() -> list[Any]:
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.request_id in stamps and out.new_token_ids:
                stamps[out.request_id].append(now)
        return outputs

    while any(not times for times in stamps.values()):
        step()
    for _ in range(args.baseline_steps // 2):  # warm-up: the first decode steps of a process run slower
        step()
    step_ms = []
    for _ in range(args.baseline_steps):
        started = time.perf_counter()
        step()
        step_ms.append((time.perf_counter() - started) * 1000)
    cold = SamplingParams(max_tokens=args.cold_output_tokens, temperature=0, ignore_eos=True)
    added = time.perf_counter()
    for i, cold_id in enumerate(cold_ids):
        prompt = [7 + (1000 + i * 97 + j * 13) % (vocab - 7) for j in range(args.cold_prompt_tokens)]
        engine.add_request(EngineRequest(cold_id, prompt, cold, cold_id))
    first_token: dict[str, float] = {}
    unfinished = set(cold_ids)
    longest_step_ms = 0.0
    longest_step: dict[str, Any] = {}
    while unfinished:
        before = engine.engine_stats()
        started = time.perf_counter()
        for out in step():
            if out.request_id in unfinished and out.new_token_ids:
                first_token.setdefault(out.request_id, time.perf_counter() - added)
            if out.request_id in unfinished and out.is_finished:
                unfinished.discard(out.request_id)
                if out.error:
                    raise SystemExit(f"{out.request_id} failed: {out.error}")
        step_ms_now = (time.perf_counter() - started) * 1000
        if step_ms_now > longest_step_ms:
            after = engine.engine_stats()
            longest_step_ms = step_ms_now
            longest_step = {
                "num_running_after": len(engine.scheduler.running),
                "num_adapters_running_after": len(
                    {s.adapter_id for s in engine.scheduler.running if s.adapter_id}
                ),
                "num_cpu_assisted_prefills": after.num_cpu_assisted_prefills
                - before.num_cpu_assisted_prefills,
                "num_batched_tokens": after.num_batched_tokens - before.num_batched_tokens,
                "num_adapter_preparations_done": after.num_adapter_preparations
                - before.num_adapter_preparations,
            }
    done = time.perf_counter()
    gaps_ms = [g * 1000 for g in token_gaps(stamps, added, done)]
    decode_ms = statistics.median(step_ms)
    stats = engine.engine_stats()
    return {
        "run": run,
        "decode_step_ms": round(decode_ms, 2),
        "max_gap_ms": round(max(gaps_ms), 2),
        "max_gap_steps": round(max(gaps_ms) / decode_ms, 2),
        "median_gap_ms": round(statistics.median(gaps_ms), 2),
        "max_gap_vs_median_gap": round(max(gaps_ms) / statistics.median(gaps_ms), 2),
        "longest_step_ms": round(longest_step_ms, 2),
        "longest_step": longest_step,
        "load_window_ms": round((done - added) * 1000, 1),
        "cold_ttft_ms_median": round(statistics.median(first_token.values()) * 1000, 1),
        "cold_ttft_ms_max": round(max(first_token.values()) * 1000, 1),
        "num_running_tokens_in_window": len(gaps_ms),
        "num_copy_waits": stats.num_copy_waits,
        "num_cpu_assisted_prefills": stats.num_cpu_assisted_prefills,
        **{f: round(getattr(stats, f), 4) for f in PREPARATION_FIELDS if hasattr(stats, f)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", type=Path, required=True, help="a dir with base/ (a HF Llama-family model)"
    )
    parser.add_argument("--adapters-dir", type=Path, default=None, help="default: MODEL_DIR/cold-r<rank>")
    parser.add_argument("--num-cold", type=int, default=10)
    parser.add_argument("--rank", type=int, default=128)
    parser.add_argument("--target-modules", default=ALL_MODULES)
    parser.add_argument("--num-running", type=int, default=4)
    parser.add_argument("--running-prompt-tokens", type=int, default=32)
    parser.add_argument("--cold-prompt-tokens", type=int, default=16)
    parser.add_argument("--cold-output-tokens", type=int, default=4)
    parser.add_argument("--baseline-steps", type=int, default=20)
    parser.add_argument("--cpu-prefill-workers", type=int, default=2)
    parser.add_argument(
        "--kv-cache-gib", type=int, default=3, help="the unified pool: KV and the cold adapters"
    )
    parser.add_argument(
        "--max-running-adapter-mib",
        type=int,
        default=None,
        help="engine_max_running_adapter_mib (default: no bound); ~the base model's weights (SmolLM2-135M bf16: "
        "256) keeps a step within ~2x a base step",
    )
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--label", default="", help="names the engine tree measured (e.g. old, new)")
    add_dtype_arg(parser)
    args = parser.parse_args()
    modules = tuple(m.strip() for m in args.target_modules.split(",") if m.strip())
    out_dir = args.adapters_dir or args.model_dir / f"cold-r{args.rank}-{len(modules)}mod"
    cold_dirs = ensure_cold_adapters(args.model_dir / "base", out_dir, args.num_cold, args.rank, modules)
    runs = [run_once(args, cold_dirs, run) for run in range(args.runs)]
    for result in runs:
        print(json.dumps({"label": args.label, **result}))
    print(
        json.dumps(
            {
                "system": "summary",
                "label": args.label,
                **git_state(),
                "cpu": cpu_model(),
                "dtype": args.dtype,
                "model_dir": str(args.model_dir),
                "num_cold": args.num_cold,
                "rank": args.rank,
                "target_modules": list(modules),
                "adapter_file_bytes": (cold_dirs[0] / "adapter_model.safetensors").stat().st_size,
                "num_running": args.num_running,
                "max_running_adapter_mib": args.max_running_adapter_mib,
                "max_gap_steps": max(r["max_gap_steps"] for r in runs),
                "max_gap_vs_median_gap": max(r["max_gap_vs_median_gap"] for r in runs),
                "max_gap_ms": max(r["max_gap_ms"] for r in runs),
                "decode_step_ms_median": statistics.median(r["decode_step_ms"] for r in runs),
            }
        )
    )


if __name__ == "__main__":
    main()
