"""Where a lorahost engine step spends its time: torch.profiler over one prefill step and a few decode steps of
the engine_throughput workload (16 requests x 200 prompt tokens, base model or 16 adapters), grouped by part.

The engine's functions are wrapped in profiler ranges here (never in the engine itself): base projections
(MergedLinear), LoRA deltas (split by op into shrink x @ A, mask, expand @ B), attention (KV write + SDPA /
decode matmuls), rotary, RMSNorm, logits (final norm + LM head), sampling, step preparation (runner.prepare).
Per part: the wall time of its ranges and the time of the torch ops inside them; "python overhead" is the
step's wall time minus the time of all its top-level torch ops (interpreter, dataclasses, dispatch).

    python benchmarks/engine_profile.py --model-dir ~/.cache/lorahost/bench-small-16 --threads 1
    python benchmarks/engine_profile.py --real-model smollm2 --threads 1 --modes base,lora

Prints one JSON line per (mode, step kind) and a markdown table on stderr.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from scheduler.core.engine_request import EngineRequest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE / "peers"))

from bench_dtype import DTYPE_HELP, bench_dtype

PARTS = (
    "linear",
    "lora_shrink",
    "lora_mask",
    "lora_expand",
    "lora_other",
    "lora_kernel_and_python",
    "attention",
    "rotary",
    "norm",
    "logits",
    "sampling",
    "prepare",
    "other_ops",
    "python_overhead",
)
_SHRINK_OPS = ("aten::mm", "aten::matmul", "aten::bmm")
_EXPAND_OPS = ("aten::addmm", "aten::addmm_", "aten::add_", "aten::baddbmm", "mkldnn::_linear_pointwise")


def _wrap(owner: Any, name: str, label: str) -> None:
    import torch

    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    setattr(owner, name, wrapped)


def instrument() -> None:
    """Wrap the engine's parts in profiler ranges (names "part:<label>")."""
    from gpu_workers.engine.layers.linear import MergedLinear
    from gpu_workers.engine.layers.norm import RMSNorm
    from gpu_workers.engine.model_runner import ModelRunner
    from gpu_workers.engine.models import llama

    _wrap(MergedLinear, "forward", "part:linear")
    _wrap(RMSNorm, "forward", "part:norm")
    _wrap(llama, "add_lora_delta", "part:lora")
    _wrap(llama, "paged_attention", "part:attention")
    _wrap(llama, "apply_rotary", "part:rotary")
    _wrap(llama.LlamaForCausalLM, "logits", "part:logits")
    _wrap(ModelRunner, "_sample", "part:sampling")
    _wrap(ModelRunner, "prepare", "part:prepare")


def _is_op(name: str) -> bool:
    return "::" in name and not name.startswith("part:")


def breakdown(events: list[Any], step_us: float) -> dict[str, float]:
    """Milliseconds per part of one profiled step (events: the profiler's FunctionEvents of that step)."""
    ms: dict[str, float] = defaultdict(float)
    op_us = 0.0
    for ev in events:
        if not _is_op(ev.name):
            continue
        parent = ev.cpu_parent
        if parent is not None and _is_op(parent.name):
            continue  # counted in its top-level op
        dur = ev.time_range.elapsed_us()
        op_us += dur
        part = _part_of(ev)
        ms[part] += dur / 1000
    # LoRA: split by op within each add_lora_delta range: x @ A (mm, or the range's first packed linear) is the
    # shrink; addmm / later packed linears / add_ the expand; masked_fill the stacked form's mask
    for ev in events:
        if ev.name != "part:lora":
            continue
        num_linears = 0
        for child in sorted(ev.cpu_children, key=lambda e: e.time_range.start):
            if not _is_op(child.name):
                continue
            dur = child.time_range.elapsed_us() / 1000
            ms["lora"] -= dur
            if child.name == "mkldnn::_linear_pointwise":
                num_linears += 1
            if child.name in _SHRINK_OPS or (child.name == "mkldnn::_linear_pointwise" and num_linears == 1):
                ms["lora_shrink"] += dur
            elif child.name in _EXPAND_OPS:
                ms["lora_expand"] += dur
            elif "masked_fill" in child.name:
                ms["lora_mask"] += dur
            else:
                ms["lora_other"] += dur
    ms.pop("lora", None)
    # the C kernel (layers/lora_kernel.py) is no torch op: its time is the lora ranges' wall minus their ops
    lora_wall = sum(ev.time_range.elapsed_us() for ev in events if ev.name == "part:lora") / 1000
    lora_ops = sum(ms.get(k, 0.0) for k in ("lora_shrink", "lora_mask", "lora_expand", "lora_other"))
    if lora_wall > 0:
        ms["lora_kernel_and_python"] = lora_wall - lora_ops
        op_us += 1000 * ms["lora_kernel_and_python"]  # not interpreter time of the step
    ms["python_overhead"] = (step_us - op_us) / 1000
    ms["total"] = step_us / 1000
    return {k: round(v, 3) for k, v in ms.items()}


def _part_of(ev: Any) -> str:
    """The part of a top-level op: "logits" anywhere up its ranges wins (the final norm), else the innermost."""
    labels = []
    parent = ev.cpu_parent
    while parent is not None:
        if parent.name.startswith("part:"):
            labels.append(parent.name[5:])
        parent = parent.cpu_parent
    if "logits" in labels:
        return "logits"
    return labels[0] if labels else "other_ops"


def profile_mode(args: argparse.Namespace, mode: str) -> list[dict[str, Any]]:
    import common
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from gpu_workers.engine.config import EngineConfig
    from gpu_workers.engine.llm_engine import LLMEngine
    from scheduler.core.sampling import SamplingParams

    engine = LLMEngine(
        EngineConfig(
            model_path=args.model_dir / "base",
            dtype=args.dtype,
            num_threads=args.threads or None,
            enable_prefix_caching=False,
            max_num_seqs=max(64, args.num_requests),
            max_num_batched_tokens=max(4096, args.num_requests * (args.prompt_len + args.max_tokens)),
        )
    )
    names = common.adapter_names(args.model_dir, args.num_requests)
    if mode == "lora":
        for n in sorted(set(names)):
            engine.load_adapter(n, str(args.model_dir / "adapters" / n))
    prompts = common.make_prompts(common.vocab_size(args.model_dir), args.num_requests, args.prompt_len)

    def add(tag: str, n: int) -> None:
        for i, prompt in enumerate(prompts):
            adapter = names[i] if mode == "lora" else None
            engine.add_request(
                EngineRequest(
                    f"{tag}-{i}",
                    prompt,
                    SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                    adapter_id=adapter,
                )
            )

    add("warm", 4)
    while engine.has_unfinished_requests():
        engine.step()
    # unprofiled reference timings
    add("ref", args.max_tokens)
    wall: list[float] = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        wall.append(time.perf_counter() - t0)
    ref_prefill_ms, ref_decode_ms = 1000 * wall[0], 1000 * statistics.median(wall[1:])

    add("prof", args.max_tokens)
    steps: list[tuple[str, float]] = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        i = 0
        while engine.has_unfinished_requests():
            with record_function(f"step:{i}"):
                t0 = time.perf_counter()
                engine.step()
                steps.append((f"step:{i}", time.perf_counter() - t0))
            i += 1
    events = prof.events()
    by_step: dict[str, list[Any]] = defaultdict(list)
    roots: dict[str, Any] = {}
    for ev in events:
        if ev.name.startswith("step:"):
            roots[ev.name] = ev
    for ev in events:
        parent = ev
        while parent.cpu_parent is not None:
            parent = parent.cpu_parent
        if parent.name.startswith("step:") and parent is not ev:
            by_step[parent.name].append(ev)
    out = []
    decode_names = [f"step:{k}" for k in range(1, len(steps))][len(steps) // 4 :][: args.decode_steps]
    for kind, step_names in (("prefill", ["step:0"]), ("decode", decode_names)):
        rows = [breakdown(by_step[s], roots[s].time_range.elapsed_us()) for s in step_names]
        keys = sorted({k for r in rows for k in r})
        mean = {k: round(statistics.fmean(r.get(k, 0.0) for r in rows), 3) for k in keys}
        out.append(
            {
                "system": "profile",
                "model_dir": str(args.model_dir),
                "mode": mode,
                "step": kind,
                "threads": torch.get_num_threads(),
                "dtype": args.dtype,
                "profiled_steps": len(rows),
                "unprofiled_ms": round(ref_prefill_ms if kind == "prefill" else ref_decode_ms, 2),
                "ms": mean,
            }
        )
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = [f"{r['mode']} {r['step']}" for r in rows]
    lines = ["| part (ms) | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for part in (*PARTS, "total"):
        vals = [r["ms"].get(part, 0.0) for r in rows]
        if all(v == 0 for v in vals):
            continue
        lines.append(f"| {part} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
    lines.append("| unprofiled step | " + " | ".join(f"{r['unprofiled_ms']:.1f}" for r in rows) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--real-model", choices=["smollm2"], default=None)
    p.add_argument("--modes", default="base,lora")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--decode-steps", type=int, default=5, help="decode steps averaged")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--dtype", default=None, help=DTYPE_HELP)
    args = p.parse_args(argv)
    args.dtype = args.dtype or bench_dtype()
    if args.model_dir is None:
        name = f"bench-{args.real_model}-16" if args.real_model else "bench-small-16"
        args.model_dir = Path(os.path.expanduser(f"~/.cache/lorahost/{name}"))
    if not (args.model_dir / "base" / "config.json").exists():
        p.error(
            f"{args.model_dir} has no base/config.json: run benchmarks/engine_throughput.py once to build it"
        )
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    instrument()
    rows: list[dict[str, Any]] = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        for row in profile_mode(args, mode):
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(markdown(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
