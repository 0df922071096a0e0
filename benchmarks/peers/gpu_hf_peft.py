"""transformers (+ peft) peer of benchmarks/gpu_engine_bench.py (project venv): the same model as the lorahost
peer (the same random weights, made on the device by the same generator), its base row on the plain model, then
one row per adapter count with peft's mixed-batch inference (`generate(..., adapter_names=[...])`: each LoRA
layer loops over the distinct adapters of the batch, peft/tuners/lora/layer.py `_mixed_batch_forward`).

peft holds only the adapters the batches use (at most `batch`; the row's JSON says how many,
`num_adapters_loaded`): its step loops over the batch's adapters, not the loaded ones, while adding an adapter
walks every module of the model (1-3 s per adapter on a 32-layer model on a CPU core, growing with the adapters
already there: 256 would take the whole slot). Adapters are added as peft does with `low_cpu_mem_usage` (on
the meta device, then the tensors assigned by `set_peft_model_state_dict`), in the model's dtype (no fp32
autocast).
Prints one JSON line per row.
"""

from __future__ import annotations

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
from hf_peft import greedy_generation_config, left_padded_batch, timed_generate
from run_info import device_name

from gpu_workers.engine.demo_model import ALL_TARGET_MODULES


def build_model(cfg: dict[str, Any], dtype: Any, device: Any, seed: int) -> Any:
    """transformers' LlamaForCausalLM built on the device, its weights overwritten with the shared random ones."""
    import torch
    from random_weights import random_base_weights
    from transformers import AutoModelForCausalLM, LlamaConfig

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), dtype=dtype)
    model = model.to(device)  # a no-op where transformers honoured the device context
    params = model.state_dict()
    missing = set(params)
    with torch.no_grad():
        for name, tensor in random_base_weights(cfg, dtype, device, seed):
            params[name].copy_(tensor)
            missing.discard(name)
    if missing:
        raise SystemExit(
            f"transformers' model has weights the generator does not make: {sorted(missing)[:4]}"
        )
    return model.eval()


def lora_config(rank: int) -> Any:
    """peft's config of a benchmark adapter (all seven projections, alpha 2r, no dropout)."""
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=LORA_ALPHA_PER_RANK * rank,
        target_modules=list(ALL_TARGET_MODULES),
        lora_dropout=0.0,
        bias="none",
    )


def add_adapters(model: Any, cfg: dict[str, Any], indices: list[int], seed: int) -> Any:
    """Add adapters `indices` to `model` (wrapping a plain model in a PeftModel first); returns the PeftModel."""
    from peft import PeftModel, get_peft_model, set_peft_model_state_dict
    from random_weights import adapter_seed, peft_state_dict, random_lora

    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    for i in indices:
        name, rank = adapter_name(i), adapter_rank(i)
        if isinstance(model, PeftModel):
            model.add_adapter(name, lora_config(rank), low_cpu_mem_usage=True, autocast_adapter_dtype=False)
        else:
            model = get_peft_model(
                model,
                lora_config(rank),
                adapter_name=name,
                autocast_adapter_dtype=False,
                low_cpu_mem_usage=True,
            )
        state = peft_state_dict(random_lora(cfg, rank, adapter_seed(seed, i), dtype, device))
        result: Any = set_peft_model_state_dict(model, state, adapter_name=name, low_cpu_mem_usage=True)
        if result.unexpected_keys:
            raise SystemExit(f"peft did not take adapter {name}'s tensors: {result.unexpected_keys[:4]}")
    return model.eval()  # get_peft_model leaves training mode on, where adapter_names is refused


def measure_row(model: Any, args: Any, prompts: list[list[int]], num_adapters: int) -> dict[str, Any]:
    """Warm-up and timed runs of the batch on `num_adapters` adapters (0: the plain model)."""
    indices = batch_adapters(num_adapters, args.batch)
    names = [adapter_name(i) for i in indices] or None
    device = next(model.parameters()).device
    input_ids, attn = left_padded_batch(prompts, device)
    gen_cfg = greedy_generation_config(model)
    first_tokens: list[list[int]] = []

    def run(max_tokens: int) -> dict[str, Any]:
        result = timed_generate(model, input_ids, attn, gen_cfg, max_tokens, names)
        new = result.pop("out")[:, input_ids.shape[1] :]
        assert tuple(new.shape) == (args.batch, max_tokens), tuple(new.shape)
        first_tokens[:] = new[:2, :8].tolist()
        return result

    runs = timed_runs(run, args.max_tokens, args.warmup_tokens, args.repeats, args.max_row_s)
    return {
        "num_distinct": len(set(indices)),
        "ranks_in_batch": sorted(adapter_rank(i) for i in set(indices)),
        "runs": len(runs),
        **common.summarize_runs(runs, args.batch * args.max_tokens),
        "first_tokens": first_tokens,
    }


def main() -> None:
    args = peer_argparser(__doc__.splitlines()[0]).parse_args()
    import peft
    import transformers
    from transformers.utils import logging as hf_logging

    from gpu_workers.engine.config import EngineConfig

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cfg = SHAPES[args.model].hf_config()
    resolved = EngineConfig(
        model_path=Path("."), dtype=args.dtype, device=args.device
    )  # the engine's auto rules
    device, dtype = resolved.resolved_device(), resolved.resolved_dtype()
    t0 = time.perf_counter()
    model = build_model(cfg, dtype, device, args.seed)
    head = {
        "system": "hf",
        "model": args.model,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "device": str(device),
        "device_name": device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "engine": f"transformers {transformers.__version__} + peft {peft.__version__}",
        "build_s": round(time.perf_counter() - t0, 2),
    }
    prompts = common.make_prompts(cfg["vocab_size"], args.batch, args.prompt_len)
    emit({**head, "num_adapters": 0, **measure_row(model, args, prompts, 0)})
    loaded: set[int] = set()
    for num_adapters in adapter_counts(args.adapter_counts):
        t1 = time.perf_counter()
        needed = sorted(set(batch_adapters(num_adapters, args.batch)) - loaded)
        model = add_adapters(model, cfg, needed, args.seed)
        loaded |= set(needed)
        load_s = round(time.perf_counter() - t1, 2)
        row = measure_row(model, args, prompts, num_adapters)
        emit(
            {
                **head,
                "num_adapters": num_adapters,
                "num_adapters_loaded": len(loaded),
                "adapter_load_s": load_s,
                **row,
            }
        )


if __name__ == "__main__":
    main()
