"""The summary line of engine_throughput.py: every system's throughput and peak memory, and the ratios of
throughputs taken in this run.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from run_info import cpu_flags, cpu_model, git_state

# (name, numerator label, denominator label): ratio of out tok/s.
RATIOS = [
    ("lorahost_lora_vs_vllm_base", "lorahost_lora", "vllm_base"),
    ("lorahost_lora_vs_vllm_lora", "lorahost_lora", "vllm_lora"),
    ("lorahost_lora_vs_hf_peft", "lorahost_lora", "hf_peft"),
    ("lorahost_lora_vs_hf_base", "lorahost_lora", "hf_base"),
    ("lorahost_base_vs_vllm_base", "lorahost_base", "vllm_base"),
    ("lorahost_base_vs_hf_base", "lorahost_base", "hf_base"),
    ("vllm_lora_vs_vllm_base", "vllm_lora", "vllm_base"),
    ("hf_peft_vs_hf_base", "hf_peft", "hf_base"),
]


OVERHEADS = [  # 1 - lora / base
    ("lorahost_lora_overhead", "lorahost_lora", "lorahost_base"),
    ("vllm_lora_overhead", "vllm_lora", "vllm_base"),
    ("hf_peft_overhead", "hf_peft", "hf_base"),
]


def summary(results: list[dict], args: argparse.Namespace) -> dict:
    tps = {r["label"]: r["out_tok_s"] for r in results if "out_tok_s" in r}
    best = {r["label"]: r["out_tok_s_best"] for r in results if "out_tok_s_best" in r}
    rss = {r["label"]: r["peak_rss_mb"] for r in results if "peak_rss_mb" in r}
    vs_floor = {r["label"]: r["decode_vs_floor"] for r in results if "decode_vs_floor" in r}
    foreign = {r["label"]: r["other_cores_busy_during"] for r in results if "other_cores_busy_during" in r}
    kernels = {  # the forms the kernel tuner chose (or was forced to) in each lorahost run
        r["label"]: r["engine_stats"]["kernel_choices"]
        for r in results
        if isinstance(r.get("engine_stats"), dict) and "kernel_choices" in r["engine_stats"]
    }
    ratios = {}
    for name, num, den in RATIOS:
        if num in tps and den in tps and tps[den] > 0:
            ratios[name] = round(tps[num] / tps[den], 3)
    for name, lora, base in OVERHEADS:
        if lora in tps and base in tps and tps[base] > 0:
            ratios[name] = round(1.0 - tps[lora] / tps[base], 3)
    return {
        "system": "summary",
        "out_tok_s": tps,
        "out_tok_s_best": best,
        "peak_rss_mb": rss,
        "ratios": ratios,
        "decode_vs_floor": vs_floor,
        "other_cores_busy_during": foreign,
        "contended": any(v > args.quiet_threshold for v in foreign.values()),
        "workload": {
            "model_dir": str(args.model_dir),
            "num_requests": args.num_requests,
            "prompt_len": args.prompt_len,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
        },
        "kernel_choices": kernels,
        "host": {
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),
            "cpu_flags": cpu_flags(),
            "python": platform.python_version(),
        },
        "git": git_state(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
