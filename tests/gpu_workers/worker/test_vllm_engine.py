"""Starting vLLM for a worker (gpu_workers/worker/vllm_engine.py), without vLLM: its engine arguments follow the
settings, and the zero adapter of base-model requests has the model's shape and holds zeros."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_workers.worker.vllm_engine import vllm_engine_args, write_zero_adapter
from settings import Settings


def test_vllm_engine_args_follow_the_settings(tmp_path: Path) -> None:
    args = vllm_engine_args(Settings(base_model_path=tmp_path, engine_max_loras=3, engine_max_cpu_loras=2))
    assert args["max_loras"] == 3 and args["max_cpu_loras"] == 4 and args["enable_lora"]
    assert args["max_lora_rank"] == 256 and args["enable_prefix_caching"]
    limited = Settings(
        base_model_path=tmp_path, engine_max_lora_rank=16, engine_enable_prefix_caching=False, max_rank=64
    )
    args = vllm_engine_args(limited)
    assert args["max_lora_rank"] == 16 and not args["enable_prefix_caching"]
    assert args["model"] == str(tmp_path) and args["max_num_seqs"] == Settings().engine.max_num_seqs


def test_the_zero_adapter_matches_the_models_shape_and_is_written_once(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    path = write_zero_adapter(base, tmp_path / "cache")
    tensors = load_file(str(path / "adapter_model.safetensors"))
    assert {tuple(t.shape) for t in tensors.values()} == {(8, 64), (64, 8)}
    assert all(not t.any() for t in tensors.values())
    assert write_zero_adapter(base, tmp_path / "cache") == path
