"""The workload of benchmarks/gpu_engine_bench.py, shared by its orchestrator, its report and its two peers
(torch-free): the model shapes, the adapter sets, which adapter each request of the batch uses, the peers'
command line and the timed runs of one row.

Models (random weights, made on the device by each peer: benchmarks/random_weights.py):
- `8b`: Llama-3-8B-shaped (32 layers, hidden 4096, intermediate 14336, 32 query / 8 KV heads, head dim 128,
  vocab 128256), 8.03e9 parameters, 16.1 GB in bf16;
- `small`: the generated `small` demo model's shape (gpu_workers/engine/demo_model.py SIZES; gpu_check.sh's
  other steps measure it), 8 layers, hidden 1024;
- `tiny`: the tests' tiny demo shape, for `--smoke` on a CPU.

Adapters: LoRA on all seven projections of every layer; adapter i has rank RANK_CYCLE[i % 5] (8..128) for
i < NUM_FULL_CYCLE_ADAPTERS and TAIL_RANK_CYCLE[i % 3] (8..32) after: with rank 128 in every fifth adapter, 256
adapters on the 8B shape would be 66 GB (5.24 MB per rank), more than an H100 holds beside the weights; as
planned they are 35.0 GB (16 adapters 3.9 GB, 64 adapters 16.2 GB). Sets are nested: the 64-adapter set is
the 256-adapter set's first 64.

The batch: `batch` requests, each `prompt_len` prompt tokens (the same token ids for every system) and
`max_tokens` output tokens (greedy, ignore_eos), all admitted at once. With n adapters, request i uses adapter
i mod n (round robin): a step holds min(n, batch) distinct adapters, at batch 32 the 64- and 256-adapter rows
run the same 32 adapters (ranks 8..128) with 64 or 256 resident. Pass a larger batch for more distinct
adapters in a step (transformers + peft then pays ~50 ms a step per distinct adapter on the 8B shape).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from gpu_workers.engine.demo_model import SIZES

RANK_CYCLE = (8, 16, 32, 64, 128)
TAIL_RANK_CYCLE = (8, 16, 32)
NUM_FULL_CYCLE_ADAPTERS = 64
LORA_ALPHA_PER_RANK = 2  # lora_alpha = 2 * r: scale 2, as the demo adapters
SYSTEMS = ("lorahost", "hf")


@dataclass(frozen=True)
class ModelShape:
    """A Llama-family architecture, written as a Hugging Face config.json (`hf_config`)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192

    def hf_config(self) -> dict[str, Any]:
        """The config.json of this shape (untied LM head, RMSNorm eps 1e-5, default RoPE)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hidden_size // self.num_heads,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 3,
        }


def _demo_shape(size: str) -> ModelShape:
    spec = SIZES[size]
    return ModelShape(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_layers=spec.num_layers,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
    )


SHAPES: dict[str, ModelShape] = {
    "8b": ModelShape(4096, 14336, 32, 32, 8, 128256, rope_theta=500000.0),
    "small": _demo_shape("small"),
    "tiny": _demo_shape("tiny"),
}


def adapter_rank(index: int) -> int:
    """The rank of adapter `index` (module doc)."""
    if index < NUM_FULL_CYCLE_ADAPTERS:
        return RANK_CYCLE[index % len(RANK_CYCLE)]
    return TAIL_RANK_CYCLE[index % len(TAIL_RANK_CYCLE)]


def adapter_name(index: int) -> str:
    """The id of adapter `index` in both systems."""
    return f"adapter-{index:03d}"


def batch_adapters(num_adapters: int, batch: int) -> list[int]:
    """The adapter index of each request of the batch, round robin (module doc); [] for the base model."""
    return [i % num_adapters for i in range(batch)] if num_adapters > 0 else []


def module_dims(cfg: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """HF module -> (in_features, out_features) of one decoder layer."""
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q = cfg["num_attention_heads"] * head_dim
    kv = cfg["num_key_value_heads"] * head_dim
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def lora_elements(cfg: dict[str, Any], rank: int) -> int:
    """Elements of lora_A and lora_B of a rank-`rank` adapter on all seven projections of every layer."""
    per_layer = sum(rank * (n_in + n_out) for n_in, n_out in module_dims(cfg).values())
    return cfg["num_hidden_layers"] * per_layer


def adapter_set_bytes(cfg: dict[str, Any], num_adapters: int, element_size: int) -> int:
    """Bytes of the first `num_adapters` adapters' weights."""
    return sum(lora_elements(cfg, adapter_rank(i)) for i in range(num_adapters)) * element_size


def peer_argparser(description: str) -> argparse.ArgumentParser:
    """The command line both peers take (gpu_engine_bench.py builds it from its own)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", choices=sorted(SHAPES), required=True)
    p.add_argument("--adapter-counts", default="16,64,256", help="comma list; a row each, after the base row")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--warmup-tokens", type=int, default=3, help="max_tokens of the untimed warm-up run")
    p.add_argument("--repeats", type=int, default=2, help="most timed runs per row (median)")
    p.add_argument("--max-row-s", type=float, default=40.0, help="no further timed run past this (s)")
    p.add_argument("--device", default="auto", help="auto (cuda when present), cuda or cpu")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA), bfloat16, float16, float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, required=True, help="for the model's config-only directory")
    return p


def adapter_counts(text: str) -> list[int]:
    """ "16,64,256" -> [16, 64, 256]."""
    return [int(v) for v in text.split(",") if v.strip()]


def timed_runs(
    run: Callable[[int], dict[str, Any]],
    max_tokens: int,
    warmup_tokens: int,
    repeats: int,
    max_row_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> list[dict[str, Any]]:
    """One untimed warm-up run (`warmup_tokens` each: the same prompts and adapters, so every shape of the
    timed runs was met once), then up to `repeats` timed runs of `max_tokens`; no further run is started
    when it would end past `max_row_s` after the first (it would take as long as the last one)."""
    run(warmup_tokens)
    runs: list[dict[str, Any]] = []
    started = clock()
    while len(runs) < max(repeats, 1):
        t0 = clock()
        runs.append(run(max_tokens))
        now = clock()
        if now - started + (now - t0) > max_row_s:
            break
    return runs


def emit(line: dict[str, Any]) -> None:
    """Print one result line, flushed (a peer killed at its time limit keeps the lines it printed)."""
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
