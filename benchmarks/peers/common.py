"""Shared workload, timing and result helpers for the engine_throughput peers.

Pure standard library: this module is imported both by the project venv (lorahost, transformers+peft)
and by the separate vLLM venv, so every system sees byte-identical prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path

# Special token ids of the demo tokenizer: <unk> <s> </s> <pad> <|system|> <|user|> <|assistant|>.
NUM_SPECIAL_IDS = 7
WORKLOAD_SEED = 20240601


def make_prompts(
    vocab_size: int, num_requests: int, prompt_len: int, seed: int = WORKLOAD_SEED
) -> list[list[int]]:
    """Deterministic prompts: `num_requests` lists of exactly `prompt_len` ids in [7, vocab_size)."""
    rng = random.Random(seed)
    return [
        [rng.randrange(NUM_SPECIAL_IDS, vocab_size) for _ in range(prompt_len)] for _ in range(num_requests)
    ]


def adapter_names(model_dir: Path, num_requests: int) -> list[str]:
    """Request i uses adapter i (mod the number of adapters): adapter-00, adapter-01, ..."""
    names = sorted(p.name for p in (Path(model_dir) / "adapters").iterdir() if p.is_dir())
    if not names:
        raise SystemExit(f"no adapters under {model_dir}/adapters")
    return [names[i % len(names)] for i in range(num_requests)]


def adapter_ranks(model_dir: Path, names: list[str]) -> dict[str, int]:
    out = {}
    for name in names:
        cfg = json.loads((Path(model_dir) / "adapters" / name / "adapter_config.json").read_text())
        out[name] = int(cfg["r"])
    return out


def vocab_size(model_dir: Path) -> int:
    return int(json.loads((Path(model_dir) / "base" / "config.json").read_text())["vocab_size"])


def peer_argparser(description: str, modes: list[str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model-dir", type=Path, required=True, help="dir with base/ and adapters/")
    p.add_argument("--mode", choices=modes, required=True)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=1, help="timed runs after one warm-up")
    p.add_argument(
        "--warmup-tokens", type=int, default=4, help="max_tokens of the warm-up run (same prompts)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: library default)")
    return p


def peak_rss_mb_self() -> float:
    """Peak RSS of this process (VmHWM), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def peak_rss_mb_children() -> float:
    """Peak RSS of the largest terminated child (e.g. an engine-core process), in MiB."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


class StepClock:
    """Records wall-clock time stamps of engine steps; first step(s) = prefill, rest = decode."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.stamps: list[float] = []

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.stamps = []

    def tick(self) -> None:
        self.stamps.append(time.perf_counter())

    def split(self, prefill_steps: int = 1) -> tuple[list[float], list[float]]:
        times, prev = [], self.t0
        for s in self.stamps:
            times.append(s - prev)
            prev = s
        return times[:prefill_steps], times[prefill_steps:]


def summarize_runs(runs: list[dict], num_out_tokens: int) -> dict:
    """Median over timed repeats. Each run: total_s, optional prefill_s / decode_step_s (list)."""
    totals = [r["total_s"] for r in runs]
    best = sorted(runs, key=lambda r: r["total_s"])[len(runs) // 2]  # median run
    out = {
        "out_tok_s": round(num_out_tokens / statistics.median(totals), 2),
        "total_s": round(statistics.median(totals), 4),
        "out_tok_s_best": round(num_out_tokens / min(totals), 2),
        "total_s_runs": [round(t, 4) for t in totals],
    }
    if best.get("prefill_s") is not None:
        out["prefill_s"] = round(best["prefill_s"], 4)
        out["prefill_steps"] = best.get("prefill_steps", 1)
    dec = best.get("decode_step_s") or []
    if dec:
        out["decode_step_ms_mean"] = round(1000 * statistics.fmean(dec), 3)
        out["decode_step_ms_median"] = round(1000 * statistics.median(dec), 3)
        out["decode_steps"] = len(dec)
    for k in ("ttft_s_mean", "tpot_ms_mean", "engine_stats"):
        if k in best:
            out[k] = best[k]
    return out


def emit(result: dict) -> None:
    """Print one JSON result line (the orchestrator picks up lines starting with {"system")."""
    line = json.dumps(result, sort_keys=False)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def base_result(system: str, mode: str, args: argparse.Namespace, **extra) -> dict:
    return {
        "system": system,
        "mode": mode,
        "num_requests": args.num_requests,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "out_tokens": args.num_requests * args.max_tokens,
        **extra,
    }


def set_threads(n: int) -> None:
    if n > 0:
        import torch

        torch.set_num_threads(n)


def env_summary() -> dict:
    return {"pid": os.getpid(), "python": sys.executable}
