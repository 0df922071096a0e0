"""Seeded random weights made on the device, for benchmarks/gpu_engine_bench.py: a Llama base model by HF
tensor name and LoRA adapters, identical in every process that asks with the same seed on the same kind of
device (one generator, the same order), so lorahost and transformers + peft run the same model and adapters
without a checkpoint: an 8B-shaped model is 16 GB that nothing writes or reads.

Values: projections and embeddings N(0, 0.02) (transformers' Llama init), norms 1; lora_A N(0, 1/in_features),
lora_B N(0, 0.05^2/r) (the demo adapters'): logits stay finite through 32 random layers. Speed does not depend
on the values.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from gpu_engine_workload import module_dims

INIT_STD = 0.02
_SUBLAYER = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}


def base_weight_shapes(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor of the base model, in checkpoint order."""
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.append((p + "input_layernorm.weight", (hidden,)))
        for module, (n_in, n_out) in module_dims(cfg).items():
            shapes.append((f"{p}{module_path(module)}.weight", (n_out, n_in)))
        shapes.append((p + "post_attention_layernorm.weight", (hidden,)))
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return shapes


def module_path(module: str) -> str:
    """ "q_proj" -> "self_attn.q_proj", "down_proj" -> "mlp.down_proj" (inside a decoder layer)."""
    return f"{_SUBLAYER.get(module, 'mlp')}.{module}"


def random_base_weights(
    cfg: dict[str, Any], dtype: torch.dtype, device: torch.device, seed: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor on `device`) of every base weight, one at a time (the consumer copies it and lets it
    go: the peak is the model plus one tensor)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, shape in base_weight_shapes(cfg):
        if name.endswith("norm.weight"):
            yield name, torch.ones(shape, dtype=dtype, device=device)
        else:
            yield (
                name,
                torch.empty(shape, dtype=dtype, device=device).normal_(0.0, INIT_STD, generator=generator),
            )


def random_lora(
    cfg: dict[str, Any], rank: int, seed: int, dtype: torch.dtype, device: torch.device
) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Per layer: module -> (lora_A [rank, in], lora_B [out, rank]) on all seven projections, on `device`."""
    generator = torch.Generator(device=device).manual_seed(seed)
    layers = []
    for _ in range(cfg["num_hidden_layers"]):
        pairs = {}
        for module, (n_in, n_out) in module_dims(cfg).items():
            lora_a = torch.empty(rank, n_in, dtype=dtype, device=device)
            lora_b = torch.empty(n_out, rank, dtype=dtype, device=device)
            lora_a.normal_(0.0, n_in**-0.5, generator=generator)
            lora_b.normal_(0.0, 0.05 * rank**-0.5, generator=generator)
            pairs[module] = (lora_a, lora_b)
        layers.append(pairs)
    return layers


def peft_state_dict(per_layer: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    """The same tensors under PEFT's names (as in adapter_model.safetensors), for set_peft_model_state_dict."""
    state = {}
    for i, pairs in enumerate(per_layer):
        for module, (lora_a, lora_b) in pairs.items():
            prefix = f"base_model.model.model.layers.{i}.{module_path(module)}"
            state[f"{prefix}.lora_A.weight"] = lora_a
            state[f"{prefix}.lora_B.weight"] = lora_b
    return state


def adapter_seed(seed: int, index: int) -> int:
    """The generator seed of adapter `index` (the base model uses `seed` itself)."""
    return seed * 100_003 + index + 1


def word_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over `vocab_size` made-up words (id i is "w<i>"; 0-3 are unk/bos/eos/pad): the
    engine detokenizes every step, and the random models have no real vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
