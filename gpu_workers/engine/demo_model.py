"""Seeded demo base models and PEFT LoRA adapters, generated locally (no hub downloads).

`generate_demo(out_dir, size, num_adapters)` writes:
  out_dir/base/                 a Hugging Face Llama model directory (config.json, model.safetensors,
                                tokenizer.json + tokenizer_config.json with a chat template)
  out_dir/adapters/<name>/      PEFT LoRA adapters (adapter_config.json, adapter_model.safetensors)
Tests use `tiny`; benchmarks use `small`; the engine contract suite uses `tiny64` (the tiny model with head dim 64:
vLLM's CPU attention refuses head dim 16).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

ALL_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelSize:
    """Dimensions of a generated demo model."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str
    adapter_ranks: tuple[int, ...]


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(64, 2, 4, 2, 176, 512, 1024, "float32", (4, 8, 16, 32, 2)),
    "tiny64": ModelSize(128, 2, 2, 1, 352, 512, 1024, "float32", (4, 8, 16, 32, 2)),
    "small": ModelSize(1024, 8, 16, 4, 2816, 8192, 2048, "bfloat16", (8, 16, 32, 64, 128)),
}

# Target-module sets cycled over the generated adapters (index i gets TARGET_SETS[i % len]).
TARGET_SETS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "v_proj"),
    ("q_proj", "k_proj", "v_proj", "o_proj"),
    ALL_TARGET_MODULES,
    ("gate_proj", "up_proj", "down_proj"),
    ("q_proj", "k_proj", "v_proj", "o_proj"),
)

_WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "about",
    "into",
    "over",
    "after",
    "lora",
    "adapter",
    "model",
    "token",
    "serve",
    "request",
    "tenant",
    "cache",
    "memory",
    "batch",
    "queue",
    "worker",
    "latency",
    "throughput",
    "prompt",
    "answer",
    "question",
    "hello",
    "world",
    "system",
    "user",
    "assistant",
    "data",
    "train",
    "learn",
    "good",
    "fast",
    "slow",
    "river",
    "mountain",
    "city",
    "music",
    "story",
    "code",
    "python",
    "compute",
    "number",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "red",
    "green",
    "blue",
    "light",
    "dark",
    "open",
    "close",
]


def synthetic_corpus(num_lines: int, seed: int) -> list[str]:
    """Deterministic pseudo-English lines used to train the demo tokenizer."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        length = rng.randint(4, 24)
        words = [rng.choice(_WORDS) for _ in range(length)]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 9999)))
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ""]))
    return lines


def train_tokenizer(vocab_size: int, out_dir: Path, seed: int = 0) -> None:
    """Train a byte-level BPE tokenizer with `tokenizers` and save it as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(4000, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def generate_base_model(out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a seeded random Llama model + trained tokenizer to out_dir; returns out_dir."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = SIZES[size]
    out_dir.mkdir(parents=True, exist_ok=True)
    train_tokenizer(spec.vocab_size, out_dir, seed)
    config = LlamaConfig(  # type: ignore[call-arg]  # rope_theta: a config kwarg transformers' stubs omit
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model = model.to(getattr(torch, spec.dtype))
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def generate_adapter(
    base_dir: Path,
    out_dir: Path,
    rank: int,
    target_modules: tuple[str, ...],
    seed: int,
    alpha: float | None = None,
    use_rslora: bool = False,
    use_dora: bool = False,
) -> Path:
    """Write one PEFT LoRA adapter with seeded random A and B (so its delta is non-zero; target_modules may include
    embed_tokens and lm_head, saved without peft's copies of their base weights); with `use_dora` a DoRA
    adapter whose magnitudes are peft's initial ones (the norms of W + s B A at peft's own init) times seeded
    factors in [0.5, 1.5], so its rescale is far from 1."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), torch_dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,  # type: ignore[arg-type]  # peft takes floats
        target_modules=list(target_modules),
        lora_dropout=0.0,
        bias="none",
        use_rslora=use_rslora,
        use_dora=use_dora,
        task_type="CAUSAL_LM",
        init_lora_weights=False,
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if (
                "lora_embedding_A" in name
            ):  # [r, vocab]: one column per token, gathered (no fan-in to scale by)
                param.copy_(torch.randn(param.shape, generator=generator))
            elif "lora_A" in name or "lora_B" in name or "lora_embedding_B" in name:
                fan_in = param.shape[1]
                std = 1.0 / fan_in**0.5 if "lora_A" in name else 0.05 / rank**0.5
                param.copy_(torch.randn(param.shape, generator=generator) * std)
            elif "lora_magnitude_vector" in name:
                param.mul_(torch.rand(param.shape, generator=generator) + 0.5)
    out_dir.mkdir(parents=True, exist_ok=True)
    # no copies of the base embedding / LM head (peft saves them when they are targeted; the platform refuses them)
    model.save_pretrained(str(out_dir), safe_serialization=True, save_embedding_layers=False)
    _rewrite_base_path(out_dir, base_dir)
    return out_dir


def _rewrite_base_path(adapter_dir: Path, base_dir: Path) -> None:
    """Point adapter_config.json's base_model_name_or_path at the base model directory's name."""
    path = adapter_dir / "adapter_config.json"
    cfg = json.loads(path.read_text())
    cfg["base_model_name_or_path"] = base_dir.name
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def adapter_plan(size: str, num_adapters: int, target_modules: tuple[str, ...] | None = None) -> list[dict]:
    """The (name, rank, target_modules, use_rslora) of each demo adapter, deterministic."""
    spec = SIZES[size]
    plan = []
    for i in range(num_adapters):
        plan.append(
            {
                "name": f"adapter-{i:02d}",
                "rank": spec.adapter_ranks[i % len(spec.adapter_ranks)],
                "target_modules": target_modules or TARGET_SETS[i % len(TARGET_SETS)],
                "use_rslora": i % 4 == 3,
            }
        )
    return plan


def generate_demo(
    out_dir: Path,
    size: str = "tiny",
    num_adapters: int = 4,
    seed: int = 0,
    target_modules: tuple[str, ...] | None = None,
) -> Path:
    """Generate a base model in out_dir/base and `num_adapters` adapters in out_dir/adapters/."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
    out_dir = Path(out_dir)
    base_dir = generate_base_model(out_dir / "base", size, seed)
    for i, item in enumerate(adapter_plan(size, num_adapters, target_modules)):
        generate_adapter(
            base_dir,
            out_dir / "adapters" / item["name"],
            rank=item["rank"],
            target_modules=item["target_modules"],
            seed=seed * 1000 + i + 1,
            use_rslora=item["use_rslora"],
        )
    return out_dir
