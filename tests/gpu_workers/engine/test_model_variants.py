"""Architecture variants vs transformers: llama3 rope scaling, Qwen2 qkv bias, tied embeddings, Mistral,
sharded checkpoints. Tiny random models saved locally (no hub)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import BatchEntry, Sequence

COMMON = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PROMPT = [1, 17, 42, 99, 7, 300, 256, 11, 5, 400, 123, 321]


def make_model(kind: str, out_dir: Path, base_model_dir: Path) -> Path:
    """Save a tiny random HF model of `kind` with the demo tokenizer files."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0)
    if kind == "llama3_rope":
        rope = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
            "rope_theta": 500000.0,
        }
        model = LlamaForCausalLM(LlamaConfig(**COMMON, rope_scaling=rope, rope_theta=500000.0))
    elif kind == "qwen2_bias_tied":
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=True))
        with torch.no_grad():  # make the biases non-zero so the test can see them
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.5)
    elif kind == "llama_tied":
        model = LlamaForCausalLM(LlamaConfig(**COMMON, tie_word_embeddings=True))
    elif kind == "mistral":
        model = MistralForCausalLM(MistralConfig(**COMMON, sliding_window=None))
    else:
        raise ValueError(kind)
    max_shard = "40KB" if kind == "mistral" else "50GB"  # mistral also checks sharded loading
    model.save_pretrained(str(out_dir), safe_serialization=True, max_shard_size=max_shard)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (base_model_dir / name).exists():
            shutil.copy(base_model_dir / name, out_dir / name)
    return out_dir


def engine_logits(engine: LLMEngine, prompt: list[int]) -> torch.Tensor:
    seq = Sequence("v", prompt, SamplingParams(temperature=0), None, 4)
    seq.block_table = engine.pool.allocate(engine.pool.num_blocks_for_tokens(len(prompt)))
    _, logits = engine.runner.execute([BatchEntry(seq, len(prompt))], True)
    engine.pool.free(seq.block_table)
    assert logits is not None
    return logits[0].cpu()  # beside the oracle's, on the CPU


@pytest.mark.parametrize("kind", ["llama3_rope", "qwen2_bias_tied", "llama_tied", "mistral"])
def test_variant_logits_and_greedy_tokens_match_transformers(
    kind: str, tmp_path: Path, base_model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = make_model(kind, tmp_path / kind, base_model_dir)
    if kind == "mistral":
        assert (model_dir / "model.safetensors.index.json").exists()
    hf: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    engine = LLMEngine(EngineConfig(model_path=model_dir, dtype="float32", num_kv_blocks=64))
    with torch.inference_mode():
        expected = hf(input_ids=torch.tensor([PROMPT])).logits[0, -1]
        torch.testing.assert_close(engine_logits(engine, PROMPT), expected, atol=1e-4, rtol=1e-4)
        hf_tokens = hf.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, min_new_tokens=8)
    [out] = engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert out.token_ids == hf_tokens[0, len(PROMPT) :].tolist()


def test_long_positions_use_llama3_scaled_rope(tmp_path: Path, base_model_dir: Path) -> None:
    """Positions past original_max_position_embeddings (64) still match transformers."""
    from transformers import AutoModelForCausalLM

    model_dir = make_model("llama3_rope", tmp_path / "l3", base_model_dir)
    hf: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    engine = LLMEngine(EngineConfig(model_path=model_dir, dtype="float32", num_kv_blocks=64))
    prompt = [1] + [(i * 37) % 500 + 3 for i in range(150)]
    with torch.inference_mode():
        expected = hf(input_ids=torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(engine_logits(engine, prompt), expected, atol=1e-4, rtol=1e-4)
