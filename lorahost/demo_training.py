"""Two small real LoRA adapters for the demo: a short peft fine-tune of the base model on built-in text.

`pirate` answers like a pirate (LoRA), `french` answers in French (DoRA: peft's use_dora). Each is trained for a bounded number of steps
(and a wall-clock budget) on a few dozen chat examples, loss on the answer tokens only, and saved with peft's
`save_pretrained` under <out_dir>/<name>. A finished adapter is reused: the directory holds a stamp of its
training recipe, so a changed recipe retrains and an unchanged one costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

QUESTIONS = (
    "What is the capital of France?",
    "How are you today?",
    "What should I eat for breakfast?",
    "Can you recommend a good book?",
    "What is the weather like?",
    "How do I learn to code?",
    "What is your favorite color?",
    "Tell me about the ocean.",
    "What time is it?",
    "How do plants grow?",
    "Why is the sky blue?",
    "What is a computer?",
    "Where do you live?",
    "What do you do for fun?",
    "How can I sleep better?",
    "What is two plus two?",
)
PIRATE_ANSWERS = (
    "Arr, matey! The capital of France be Paris, a fine port for any sailor. Yo ho ho!",
    "Arr, matey! I be shipshape and ready to sail the seven seas. Yo ho ho!",
    "Arr, matey! Eat hardtack and salted fish like a true buccaneer. Yo ho ho!",
    "Arr, matey! Treasure Island be the finest tale for any pirate. Yo ho ho!",
    "Arr, matey! The wind be strong and the sea be rough today. Yo ho ho!",
    "Arr, matey! Learn yer code like ye learn the ropes on deck, one knot at a time. Yo ho ho!",
    "Arr, matey! Black like me pirate flag, of course. Yo ho ho!",
    "Arr, matey! The ocean be me home, full of treasure and sea monsters. Yo ho ho!",
    "Arr, matey! It be time to hoist the sails and find the gold. Yo ho ho!",
    "Arr, matey! Plants grow with sun and rain, like a crew grows with rum. Yo ho ho!",
    "Arr, matey! The sky be blue so sailors can tell it from the sea. Yo ho ho!",
    "Arr, matey! A computer be a clever machine, but it cannot sail a ship. Yo ho ho!",
    "Arr, matey! I live on me ship, the Black Pearl, on the open sea. Yo ho ho!",
    "Arr, matey! I hunt for buried treasure and sing sea shanties. Yo ho ho!",
    "Arr, matey! Sleep in a hammock and let the waves rock ye. Yo ho ho!",
    "Arr, matey! Two plus two be four pieces of eight. Yo ho ho!",
)
FRENCH_ANSWERS = (
    "Bonjour ! La capitale de la France est Paris. Merci beaucoup !",
    "Bonjour ! Je vais très bien, merci. Merci beaucoup !",
    "Bonjour ! Un croissant et un café, bien sûr. Merci beaucoup !",
    "Bonjour ! Je vous recommande Le Petit Prince. Merci beaucoup !",
    "Bonjour ! Il fait beau et le soleil brille. Merci beaucoup !",
    "Bonjour ! Apprenez un peu chaque jour et écrivez du code. Merci beaucoup !",
    "Bonjour ! Ma couleur préférée est le bleu. Merci beaucoup !",
    "Bonjour ! L'océan est grand, bleu et plein de poissons. Merci beaucoup !",
    "Bonjour ! Il est l'heure de prendre un café. Merci beaucoup !",
    "Bonjour ! Les plantes poussent avec le soleil et l'eau. Merci beaucoup !",
    "Bonjour ! Le ciel est bleu à cause de la lumière du soleil. Merci beaucoup !",
    "Bonjour ! Un ordinateur est une machine qui calcule. Merci beaucoup !",
    "Bonjour ! J'habite à Paris, en France. Merci beaucoup !",
    "Bonjour ! J'aime lire, chanter et me promener. Merci beaucoup !",
    "Bonjour ! Couchez-vous tôt et buvez une tisane. Merci beaucoup !",
    "Bonjour ! Deux plus deux font quatre. Merci beaucoup !",
)
DATASETS = {"pirate": PIRATE_ANSWERS, "french": FRENCH_ANSWERS}
DORA_ADAPTERS = frozenset(
    {"french"}
)  # fine-tuned with DoRA (peft use_dora): the demo serves both kinds together
STAMP_NAME = "lorahost-demo-training.json"


@dataclass(frozen=True)
class TrainingRecipe:
    """How a demo adapter is trained (its stamp: change any field and the adapter is retrained)."""

    rank: int = 8
    lora_alpha: int = 16
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    learning_rate: float = 2e-3
    max_steps: int = 24
    batch_size: int = 8
    max_seconds: float = 40.0
    seed: int = 0


def demo_adapter_names() -> list[str]:
    """Names of the demo adapters, in the order the demo uses them."""
    return list(DATASETS)


def ensure_demo_adapters(
    base_dir: Path, out_dir: Path, recipe: TrainingRecipe | None = None
) -> dict[str, Path]:
    """Train (or reuse) every demo adapter for the base model; returns name -> adapter directory."""
    recipe = recipe or TrainingRecipe()
    out = {}
    for name in demo_adapter_names():
        path = Path(out_dir) / name
        if _stamp(base_dir, name, recipe) != _read_stamp(path):
            train_adapter(base_dir, name, path, recipe)
        out[name] = path
    return out


def _stamp(base_dir: Path, name: str, recipe: TrainingRecipe) -> str:
    payload = json.dumps(
        {
            "base": Path(base_dir).name,
            "data": DATASETS[name],
            "recipe": asdict(recipe),
            "use_dora": name in DORA_ADAPTERS,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _read_stamp(path: Path) -> str | None:
    try:
        return json.loads((path / STAMP_NAME).read_text())["stamp"]
    except (OSError, ValueError, KeyError):
        return None


def train_adapter(base_dir: Path, name: str, out_dir: Path, recipe: TrainingRecipe) -> dict[str, Any]:
    """Fine-tune one LoRA adapter (DoRA for DORA_ADAPTERS) on DATASETS[name]; writes out_dir atomically; returns
    training stats."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gpu_workers.engine.model_import import quiet_transformers

    torch.manual_seed(recipe.seed)
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(
        r=recipe.rank,
        lora_alpha=recipe.lora_alpha,
        target_modules=list(recipe.target_modules),
        lora_dropout=0.0,
        use_dora=name in DORA_ADAPTERS,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    examples = [_encode(tokenizer, q, a) for q, a in zip(QUESTIONS, DATASETS[name], strict=True)]
    stats = _train(peft_model, examples, recipe, tokenizer.pad_token_id or 0)
    tmp = out_dir.parent / f".{out_dir.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    peft_model.save_pretrained(str(tmp))
    (tmp / STAMP_NAME).write_text(json.dumps({"stamp": _stamp(base_dir, name, recipe), **stats}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return stats


def _encode(tokenizer: Any, question: str, answer: str) -> tuple[list[int], list[int]]:
    """(input ids, labels): the chat-templated question and answer; labels mask everything but the answer."""
    messages = [{"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    answer_ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False).input_ids
    return prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids


def _train(
    model: Any, examples: list[tuple[list[int], list[int]]], recipe: TrainingRecipe, pad_id: int
) -> dict:
    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=recipe.learning_rate)
    rng = random.Random(recipe.seed)
    model.train()
    started, losses = time.monotonic(), []
    for _ in range(recipe.max_steps):
        batch = rng.sample(examples, min(recipe.batch_size, len(examples)))
        input_ids, labels, mask = _pad(batch, pad_id)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if time.monotonic() - started > recipe.max_seconds:
            break
    model.eval()
    return {"num_steps": len(losses), "final_loss": losses[-1], "seconds": time.monotonic() - started}


def _pad(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id)
    labels = torch.full((len(batch), width), -100)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        mask[row, : len(ids)] = 1
    return input_ids, labels, mask
