"""lorahost peer of benchmarks/gpu_engine_bench.py (project venv): the native engine over a model made on the
device with random weights (no checkpoint: the model runner loads tensors handed to it; the model directory
holds only config.json), its base row, then one row per adapter count with that many adapters on the device
(random, made on the device, packed by the engine and installed through `LLMEngine.install_adapter`; the
64-adapter row adds 48 to the 16 of the row before). The page pool is sized to hold every adapter beside
twice the batch's KV, so none is evicted. Prints one JSON line per row (benchmarks/gpu_engine_workload.py).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import common
from gpu_engine_workload import (
    LORA_ALPHA_PER_RANK,
    SHAPES,
    adapter_counts,
    adapter_name,
    adapter_rank,
    batch_adapters,
    emit,
    peer_argparser,
    timed_runs,
)
from lorahost_engine import forced_kernel_forms, run_engine_steps
from run_info import device_name

from gpu_workers.engine.demo_model import ALL_TARGET_MODULES


def write_config_dir(cfg: dict[str, Any], path: Path) -> Path:
    """A model directory with only config.json (the weights are handed to the runner)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path


def adapter_pool_bytes(cfg: dict[str, Any], num_adapters: int, element_size: int, block_size: int) -> int:
    """Device bytes of the pages the first `num_adapters` adapters take in a unified pool (the engine's own
    layout rule: gpu_workers/engine/adapter_layout.py)."""
    from gpu_workers.engine.adapter_layout import layer_numels_for, num_pages_for_layout
    from gpu_workers.engine.layers.lora_forms import projection_slices

    num_layers, num_kv_heads = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    slices = projection_slices(
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["num_attention_heads"],
        num_kv_heads,
        cfg["head_dim"],
    )
    in_features = {p: s[0] for p, s in slices.items()}
    output_slices = {p: s[1] for p, s in slices.items()}
    page_numel = block_size * num_kv_heads * cfg["head_dim"]
    pages_of_rank: dict[int, int] = {}
    for rank in {adapter_rank(i) for i in range(num_adapters)}:
        numels = layer_numels_for(
            rank, ALL_TARGET_MODULES, range(num_layers), num_layers, in_features, output_slices
        )
        pages_of_rank[rank] = num_pages_for_layout(numels, page_numel)
    num_pages = sum(pages_of_rank[adapter_rank(i)] for i in range(num_adapters))
    return num_pages * 2 * num_layers * page_numel * element_size  # K and V of every layer


def build_engine(args: Any, cfg: dict[str, Any], max_adapters: int) -> Any:
    """The engine over random weights made on its device, with room for `max_adapters` adapters."""
    from random_weights import random_base_weights, word_tokenizer

    from gpu_workers.engine.config import EngineConfig
    from gpu_workers.engine.llm_engine import LLMEngine
    from gpu_workers.engine.model_runner import ModelRunner

    block_size = 16
    element_size = (
        EngineConfig(model_path=Path("."), dtype=args.dtype, device=args.device).resolved_dtype().itemsize
    )
    num_kv_blocks = 2 * args.batch * -(-(args.prompt_len + args.max_tokens + 1) // block_size)
    config = EngineConfig(
        model_path=write_config_dir(cfg, args.work_dir / f"{args.model}-config"),
        dtype=args.dtype,
        device=args.device,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        adapter_cache_bytes=adapter_pool_bytes(cfg, max_adapters, element_size, block_size) or None,
        max_num_seqs=args.batch,
        max_num_batched_tokens=max(4096, args.batch * args.prompt_len),
        enable_prefix_caching=False,  # the warm-up replays the timed prompts
        **forced_kernel_forms(EngineConfig.model_fields),
    )
    weights = random_base_weights(cfg, config.resolved_dtype(), config.resolved_device(), args.seed)
    runner = ModelRunner(config, weights=weights)
    return LLMEngine(config, executor=runner, tokenizer=word_tokenizer(cfg["vocab_size"]))


def install_adapters(engine: Any, cfg: dict[str, Any], start: int, stop: int, seed: int) -> None:
    """Make adapters start..stop-1 on the engine's device, pack them and install them."""
    from random_weights import adapter_seed, random_lora

    runner = engine.runner
    for i in range(start, stop):
        rank = adapter_rank(i)
        per_layer = random_lora(cfg, rank, adapter_seed(seed, i), runner.dtype, runner.device)
        adapter = runner.transfers.pack_adapter(adapter_name(i), per_layer, rank, float(LORA_ALPHA_PER_RANK))
        del per_layer
        engine.install_adapter(adapter)


def measure_row(engine: Any, args: Any, prompts: list[list[int]], num_adapters: int) -> dict[str, Any]:
    """Warm-up and timed runs of the batch on `num_adapters` adapters (0: the base model)."""
    from scheduler.core.sampling import SamplingParams

    indices = batch_adapters(num_adapters, args.batch)
    adapter_ids = [adapter_name(i) for i in indices] or None
    tags = itertools.count()
    first_tokens: list[list[int]] = []

    def run(max_tokens: int) -> dict[str, Any]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        tag = f"n{num_adapters}-{next(tags)}"
        result = run_engine_steps(
            engine, prompts, adapter_ids, params, tag, 100 * (max_tokens + args.prompt_len)
        )
        tokens = result.pop("tokens")
        assert all(len(t) == max_tokens for t in tokens), [len(t) for t in tokens]
        first_tokens[:] = [t[:8] for t in tokens[:2]]
        return result

    runs = timed_runs(run, args.max_tokens, args.warmup_tokens, args.repeats, args.max_row_s)
    stats = engine.runner_stats()
    return {
        "num_distinct": len(set(indices)),
        "ranks_in_batch": sorted(adapter_rank(i) for i in set(indices)),
        "num_adapters_loaded": stats.num_loaded_adapters,
        "adapter_bytes_loaded": stats.adapter_bytes,
        "runs": len(runs),
        **common.summarize_runs(runs, args.batch * args.max_tokens),
        "first_tokens": first_tokens,
        "runner_stats": stats.model_dump(),  # kernel_choices: the forms the engine ran (chosen or forced)
    }


def main() -> None:
    args = peer_argparser(__doc__.splitlines()[0]).parse_args()
    cfg = SHAPES[args.model].hf_config()
    counts = adapter_counts(args.adapter_counts)
    t0 = time.perf_counter()
    engine = build_engine(args, cfg, max(counts, default=0))
    runner = engine.runner
    head = {
        "system": "lorahost",
        "model": args.model,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "device": str(runner.device),
        "device_name": device_name(runner.device),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "build_s": round(time.perf_counter() - t0, 2),
    }
    prompts = common.make_prompts(cfg["vocab_size"], args.batch, args.prompt_len)
    emit({**head, "num_adapters": 0, **measure_row(engine, args, prompts, 0)})
    num_installed = 0
    for num_adapters in counts:
        t1 = time.perf_counter()
        install_adapters(engine, cfg, num_installed, num_adapters, args.seed)
        num_installed = max(num_installed, num_adapters)
        load_s = round(time.perf_counter() - t1, 2)
        emit(
            {
                **head,
                "num_adapters": num_adapters,
                "adapter_load_s": load_s,
                **measure_row(engine, args, prompts, num_adapters),
            }
        )


if __name__ == "__main__":
    main()
