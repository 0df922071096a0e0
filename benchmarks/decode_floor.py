"""Memory-bandwidth floor of a decode step, for benchmarks/engine_throughput.py (run with the project venv).

A decode step must read every weight of the model once (all projections of every layer and the LM head;
the embedding only for the looked-up rows, ~0), every adapter in the batch once (its lora_A and lora_B), and
each sequence's K and V up to its context. floor = those bytes / the machine's measured read bandwidth
(best of a few full reductions of a tensor much larger than the caches, with the benchmark's thread count).
A step can only beat the floor if weights stay in cache between steps, which they do not at these sizes.

    python benchmarks/decode_floor.py --model-dir ~/.cache/lorahost/bench-small-16 --threads 1
prints one JSON line {"system": "floor", "read_gb_s": ..., "base": {...}, "lora": {...}}.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any

ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
BANDWIDTH_BYTES = 512 * 2**20


def measure_read_bandwidth(num_threads: int, num_bytes: int = BANDWIDTH_BYTES, repeats: int = 5) -> float:
    """Read bandwidth in bytes/s: best of `repeats` sums over an fp32 tensor of `num_bytes` (0 threads: torch's
    default)."""
    import torch

    if num_threads > 0:
        torch.set_num_threads(num_threads)
    x = torch.ones(num_bytes // 4, dtype=torch.float32)
    x.sum()  # fault the pages in
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return num_bytes / best


def measure_copy_bandwidth(num_bytes: int = 2 * 2**30, repeats: int = 10) -> float:
    """A CUDA device's memory bandwidth in bytes/s: device-to-device copies of a `num_bytes` tensor (far beyond
    the L2 cache) timed with CUDA events, counting the bytes read and written (as CUDA's bandwidthTest counts
    a device-to-device copy); best of 3 rounds of `repeats` copies."""
    import torch

    src = torch.empty(num_bytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000 / repeats)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * num_bytes / best


def step_floor(
    weight_elems: int, adapter_elems: int, kv_elems: int, element_size: int, read_bytes_per_s: float
) -> dict[str, Any]:
    """Bytes a decode step reads (weights, the batch's distinct adapters, K and V) and the floor ms they take
    at `read_bytes_per_s`."""
    weights, adapters, kv = (n * element_size for n in (weight_elems, adapter_elems, kv_elems))
    total = weights + adapters + kv
    return {
        "weight_mb": round(weights / 1e6, 1),
        "adapter_mb": round(adapters / 1e6, 1),
        "kv_mb": round(kv / 1e6, 1),
        "total_mb": round(total / 1e6, 1),
        "floor_ms": round(1000 * total / read_bytes_per_s, 3),
    }


def weight_elements(cfg: dict[str, Any]) -> int:
    """Elements a decode step reads from the base model: every projection of every layer, the norms and the
    LM head (tied or not: the vocab x hidden matrix is read once)."""
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    num_heads = cfg["num_attention_heads"]
    num_kv_heads = cfg.get("num_key_value_heads") or num_heads
    head_dim = cfg.get("head_dim") or hidden // num_heads
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter + 2 * hidden
    return cfg["num_hidden_layers"] * per_layer + cfg["vocab_size"] * hidden + hidden


def safetensors_lora_elements(path: Path) -> int:
    """Elements of the lora_A / lora_B tensors in a safetensors file (its JSON header only)."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    total = 0
    for name, info in header.items():
        if name != "__metadata__" and ("lora_A" in name or "lora_B" in name):
            n = 1
            for d in info["shape"]:
                n *= d
            total += n
    return total


def kv_elements(cfg: dict[str, Any], context_lens: list[int]) -> int:
    """Elements of K and V a decode step reads for sequences at these context lengths."""
    num_heads = cfg["num_attention_heads"]
    num_kv_heads = cfg.get("num_key_value_heads") or num_heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
    return 2 * cfg["num_hidden_layers"] * num_kv_heads * head_dim * sum(context_lens)


def decode_floor(
    model_dir: Path,
    adapter_names: list[str],
    num_requests: int,
    prompt_len: int,
    max_tokens: int,
    dtype: str,
    read_bytes_per_s: float,
) -> dict[str, Any]:
    """Bytes and floor ms of the median decode step (context prompt_len + max_tokens // 2) of
    `num_requests` sequences, with the distinct `adapter_names` in the batch (empty: base model)."""
    cfg = json.loads((model_dir / "base" / "config.json").read_text())
    adapter_elems = sum(
        safetensors_lora_elements(model_dir / "adapters" / name / "adapter_model.safetensors")
        for name in sorted(set(adapter_names))
    )
    kv_elems = kv_elements(cfg, [prompt_len + max_tokens // 2] * num_requests)
    return step_floor(weight_elements(cfg), adapter_elems, kv_elems, ELEMENT_BYTES[dtype], read_bytes_per_s)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
    import common
    from bench_dtype import DTYPE_HELP, bench_dtype

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, required=True, help="dir with base/ and adapters/")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--dtype", default=None, choices=sorted(ELEMENT_BYTES), help=DTYPE_HELP)
    p.add_argument(
        "--threads", type=int, default=0, help="threads of the bandwidth test (0: torch's default)"
    )
    args = p.parse_args(argv)
    args.dtype = args.dtype or bench_dtype()
    bandwidth = measure_read_bandwidth(args.threads)
    import torch

    names = common.adapter_names(args.model_dir, args.num_requests)
    workload = (args.num_requests, args.prompt_len, args.max_tokens, args.dtype, bandwidth)
    line = {
        "system": "floor",
        "read_gb_s": round(bandwidth / 1e9, 2),
        "threads": torch.get_num_threads(),
        "dtype": args.dtype,
        "base": decode_floor(args.model_dir, [], *workload),
        "lora": decode_floor(args.model_dir, names, *workload),
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
