"""Cold-adapter TTFT: CPU-assisted prefill vs waiting for the adapter copy vs a resident (warm) adapter.

One request at a time on the native engine: a `--prompt-tokens` prompt with an adapter that is
  warm      already on the device,
  assisted  only on the host; its copy takes `--copy-seconds` over an emulated link (adapter_link_gbps
            derived from the adapter's bytes) and the prefill runs at once on the host copy (CPU workers),
  waiting   the same copy with cpu_prefill_workers=0 (the request waits for the copy).
TTFT = first token's step return - add_request, median over `--trials` (a fresh adapter id per cold trial).

Like with like: every request has a prompt of its own (`distinct_prompt`: no two requests of any arm share a
token at the same position) and prefix caching is off in every arm (enable_prefix_caching=False), so no
arm's TTFT is a prefix-cache hit. (Before, the warm arm repeated one prompt with one adapter, a cache hit
after the first trial: warm 58 ms against 557 ms with caching off, on SmolLM2 with a rank-128 adapter.)
The summary prints the ratios assisted/warm, waiting/warm and waiting/assisted.

    PYTHONPATH=. .venv/bin/python benchmarks/cold_adapter_ttft.py --model-dir ~/.cache/lorahost/bench-small-16

Output: one JSON line per mode, then a summary line (with "prefix_caching": false, "distinct_prompts": true).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.bench_dtype import add_dtype_arg
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams


def distinct_prompt(index: int, num_tokens: int, vocab_size: int) -> list[int]:
    """Prompt number `index`: tokens that differ from every other index's at every position (ids >= 7, below
    `vocab_size`; distinct for indices up to vocab_size - 7), so no request reuses another's KV."""
    num_ids = vocab_size - 7
    if not 0 <= index < num_ids:
        raise ValueError(f"index must be in [0, {num_ids}), got {index}")
    return [7 + (index + i * 7919) % num_ids for i in range(num_tokens)]


def ttft_ratios(medians_ms: dict[str, float]) -> dict[str, float]:
    """assisted/warm, waiting/warm and waiting/assisted of the median TTFTs (3 decimals)."""
    pairs = {"assisted_vs_warm": ("assisted", "warm"), "waiting_vs_warm": ("waiting", "warm")}
    pairs["waiting_vs_assisted"] = ("waiting", "assisted")
    return {name: round(medians_ms[a] / medians_ms[b], 3) for name, (a, b) in pairs.items()}


def ttft(engine: LLMEngine, request_id: str, prompt: list[int], adapter_id: str) -> float:
    """Seconds from add_request to the step that returns the first token (then runs to the end)."""
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    started = time.perf_counter()
    engine.add_request(EngineRequest(request_id, prompt, params, adapter_id))
    first = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if first is None and out.new_token_ids:
                first = time.perf_counter() - started
    assert first is not None
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="demo dir with base/ and adapters/")
    parser.add_argument("--adapter", default="adapter-03")
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--copy-seconds", type=float, default=0.5)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--cpu-prefill-workers", type=int, default=2)
    add_dtype_arg(parser)
    parser.add_argument("--num-threads", type=int, default=None)
    args = parser.parse_args()
    adapter_dir = args.model_dir / "adapters" / args.adapter

    def engine_for(workers: int, link_gbps: float | None) -> LLMEngine:
        config = EngineConfig(
            model_path=args.model_dir / "base",
            dtype=args.dtype,
            kv_cache_bytes=1 << 28,
            cpu_prefill_workers=workers,
            adapter_link_gbps=link_gbps,
            num_threads=args.num_threads,
            enable_prefix_caching=False,
        )
        engine = LLMEngine(config)
        engine.load_adapter("warm", adapter_dir)
        return engine

    probe = engine_for(args.cpu_prefill_workers, None)
    vocab_size = probe.runner.args.vocab_size
    num_bytes = probe.runner.adapters["warm"].num_bytes
    link_gbps = num_bytes / args.copy_seconds / 1e9
    engines = {
        "warm": probe,
        "assisted": engine_for(args.cpu_prefill_workers, link_gbps),
        "waiting": engine_for(0, link_gbps),
    }
    prompt_index = iter(range(vocab_size - 7))  # one prompt per request, across every arm
    results: dict[str, list[float]] = {mode: [] for mode in engines}
    for mode, engine in engines.items():
        ttft(engine, "warmup", distinct_prompt(next(prompt_index), args.prompt_tokens, vocab_size), "warm")
    for i in range(args.trials):  # interleaved, so that every mode sees the same machine load
        for mode, engine in engines.items():
            adapter_id = "warm"
            if mode != "warm":
                adapter_id = f"cold-{i}"
                engine.register_adapter(adapter_id, adapter_dir)
            prompt = distinct_prompt(next(prompt_index), args.prompt_tokens, vocab_size)
            results[mode].append(ttft(engine, f"r{i}", prompt, adapter_id))
    for mode, engine in engines.items():
        stats, runner = engine.engine_stats(), engine.runner_stats()
        print(
            json.dumps(
                {
                    "mode": mode,
                    "num_cpu_assisted_prefills": stats.num_cpu_assisted_prefills,
                    "num_copy_waits": stats.num_copy_waits,
                    "num_adapter_copies": runner.num_adapter_copies,
                    "adapter_copy_seconds_total": round(runner.adapter_copy_seconds_total, 3),
                }
            )
        )
    summary = {m: round(statistics.median(t) * 1000, 1) for m, t in results.items()}
    for mode, times in results.items():
        ms = [round(t * 1000, 1) for t in times]
        print(json.dumps({"mode": mode, "ttft_ms_median": summary[mode], "ttft_ms": ms}))
    print(
        json.dumps(
            {
                "system": "summary",
                "adapter_bytes": num_bytes,
                "adapter_link_gbps": link_gbps,
                "prompt_tokens": args.prompt_tokens,
                "dtype": args.dtype,
                "ttft_ms_median": summary,
                "ttft_ratio": ttft_ratios(summary),
                "prefix_caching": False,
                "distinct_prompts": True,
            }
        )
    )


if __name__ == "__main__":
    main()
