"""What the sampling features cost per decode step (issue 37's goals: logprobs with top_logprobs=5 <= 1.05x
TPOT), on the native engine: a batch of 16 rows over 16 adapters, each row `--num-tokens` greedy tokens, with
  none       plain greedy rows;
  logprobs5  every row asks logprobs with 5 alternatives;
  penalties  half the rows with presence / frequency / repetition penalties and a logit_bias;
  all        every row with penalties, bias and logprobs 5.
Prints one JSON line per (variant, repeat) with the batch's TPOT (mean over rows: (finish - first token) /
(tokens - 1)) and the ratio to `none` of the same repeat; the variants of a repeat run back to back. On a
shared machine step times swing with other processes' load, so it also prints, per variant, the sampler
stage alone (`stage: sampler`: `layers/sampler.sample` on fixed [16, vocab] logits with 48-token histories,
the minimum of `--stage-repeats` runs, robust to load) and what it adds to the `none` TPOT's minimum.

    PYTHONPATH=. .venv/bin/python benchmarks/sampling_overhead.py --model-dir ~/.cache/lorahost/bench-smollm2-16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.run_info import cpu_model
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.layers.logits_processors import RowHistory
from gpu_workers.engine.layers.sampler import sample
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.sampling import SamplingParams

NUM_ROWS = 16
PENALTIES = {
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.2,
    "logit_bias": {5: 2.0},
}


def variant_params(variant: str, num_tokens: int) -> list[SamplingParams]:
    """The batch's per-row parameters of one variant (module doc)."""
    base = {"max_tokens": num_tokens, "temperature": 0.0, "ignore_eos": True}
    rows = []
    for i in range(NUM_ROWS):
        extra: dict = {}
        if variant in ("logprobs5", "all"):
            extra["logprobs"] = 5
        if variant == "all" or (variant == "penalties" and i % 2):
            extra.update(PENALTIES)
        rows.append(SamplingParams(**base, **extra))
    return rows


def batch_tpot_ms(
    engine: LLMEngine, prompts: list[list[int]], adapters: list[str | None], params: list
) -> float:
    """Mean TPOT (ms) of the batch's rows."""
    outs = engine.generate(prompts, params, adapter_ids=adapters)
    tpots = [
        (o.finish_time - o.first_token_time) * 1000 / (len(o.token_ids) - 1)
        for o in outs
        if o.finish_time is not None and o.first_token_time is not None
    ]
    return statistics.mean(tpots)


def sampler_stage_ms(engine: LLMEngine, variant: str, num_repeats: int) -> float:
    """The sampler stage's time (ms, minimum of num_repeats) for a variant's 16 rows on fixed logits."""
    import torch

    vocab = engine.runner.args.vocab_size
    logits = torch.randn(NUM_ROWS, vocab, generator=torch.Generator().manual_seed(0))
    histories = [RowHistory(list(range(100 + i, 148 + i)), 16) for i in range(NUM_ROWS)]
    params = variant_params(variant, 64)
    times = []
    for _ in range(num_repeats):
        start = time.perf_counter()
        sample(logits, params, [None] * NUM_ROWS, histories, engine.eos_token_ids)
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--num-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--stage-repeats", type=int, default=50)
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model_path=args.model_dir / "base", dtype=args.dtype, num_kv_blocks=512))
    names = sorted(p.name for p in (args.model_dir / "adapters").iterdir())[:NUM_ROWS]
    for name in names:
        engine.load_adapter(name, args.model_dir / "adapters" / name)
    prompts = [
        engine.tokenizer.encode(f"request {i}: tell me about adapters and tokens") for i in range(NUM_ROWS)
    ]
    adapters: list[str | None] = [names[i % len(names)] for i in range(NUM_ROWS)]
    batch_tpot_ms(engine, prompts, adapters, variant_params("none", 4))  # warm up
    none_tpots = []
    for repeat in range(args.repeats):
        baseline = None
        for variant in ("none", "logprobs5", "penalties", "all"):
            tpot = batch_tpot_ms(engine, prompts, adapters, variant_params(variant, args.num_tokens))
            baseline = tpot if variant == "none" else baseline
            none_tpots += [tpot] if variant == "none" else []
            record = {
                "bench": "sampling_overhead", "variant": variant, "repeat": repeat, "tpot_ms": round(tpot, 3),
                "ratio_to_none": round(tpot / baseline, 3) if baseline else None, "rows": NUM_ROWS,
                "cpu": cpu_model(), "loadavg_1m": os.getloadavg()[0], "dtype": args.dtype,
                "model": args.model_dir.name,
            }  # fmt: skip
            print(json.dumps(record), flush=True)

    stage_none = sampler_stage_ms(engine, "none", args.stage_repeats)
    for variant in ("none", "logprobs5", "penalties", "all"):
        stage = sampler_stage_ms(engine, variant, args.stage_repeats)
        record = {
            "bench": "sampling_overhead", "stage": "sampler", "variant": variant, "sampler_ms": round(stage, 3),
            "added_ms": round(stage - stage_none, 3), "min_none_tpot_ms": round(min(none_tpots), 3),
            "tpot_ratio_if_added": round((min(none_tpots) + stage - stage_none) / min(none_tpots), 3),
            "cpu": cpu_model(), "loadavg_1m": os.getloadavg()[0], "vocab": engine.runner.args.vocab_size,
        }  # fmt: skip
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
