"""LoRA on embed_tokens and lm_head (peft target_modules of those names) on the engine: greedy tokens equal
transformers + peft in fp32 for adapters with those targets (with and without the decoder projections, rsLoRA,
each alone) and in a mixed batch of 16 rows beside plain LoRA and base rows, on every LoRA form the kernel tuner
chooses from (the Triton ones under TRITON_INTERPRET=1), in both memory modes and with the CPU-assisted prefill
(layers/vocab_lora.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.demo_model import generate_adapter
from gpu_workers.engine.layers.lora_forms import DECODE_LORA_FORMS
from gpu_workers.engine.layers.vocab_lora import VocabStep
from scheduler.core.sampling import SamplingParams
from tests.gpu_workers.conftest import HfOracle
from tests.gpu_workers.engine.extra_adapter_checks import (
    ALL_MODULES,
    GREEDY,
    assert_host_copy_prefill_gives_peft_tokens,
    assert_peft_tokens,
    engine_with,
    forms_served_on,
    mixed_rows,
)

VOCAB = ("embed_tokens", "lm_head")
# (name, rank, target modules, rsLoRA): both vocab modules beside every projection, an rsLoRA one beside a
# subset, and each vocab module alone (an adapter without any decoder-layer LoRA)
VOCAB_PLAN = (
    ("vocab-all", 8, (*ALL_MODULES, *VOCAB), False),
    ("vocab-rs", 4, ("q_proj", "v_proj", "down_proj", *VOCAB), True),
    ("embed-only", 4, ("embed_tokens",), False),
    ("head-only", 4, ("lm_head",), False),
)


@pytest.fixture(scope="module")
def vocab_dirs(base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The adapters of VOCAB_PLAN, saved by peft with seeded non-trivial weights."""
    root = tmp_path_factory.mktemp("vocab")
    return {
        name: generate_adapter(base_model_dir, root / name, rank, modules, seed=200 + i, use_rslora=rs)
        for i, (name, rank, modules, rs) in enumerate(VOCAB_PLAN)
    }


@pytest.fixture(scope="module")
def oracle(base_model_dir: Path, adapter_dirs: dict[str, Path], vocab_dirs: dict[str, Path]) -> HfOracle:
    """fp32 transformers + peft with the demo LoRA adapters and the vocab ones."""
    return HfOracle(base_model_dir, {**adapter_dirs, **vocab_dirs}, torch.float32)


def test_vocab_lora_changes_the_logits_and_counts_its_bytes(
    make_engine: Any, vocab_dirs: dict[str, Path], oracle: HfOracle, prompt_ids: list[list[int]]
) -> None:
    """The oracle is not trivial: each vocab LoRA changes peft's logits; the engine holds it beside the layers
    and counts its vocab-sized tensors in the adapter's bytes."""
    engine = engine_with(make_engine, vocab_dirs)
    args = engine.runner.args
    base = oracle.logits(prompt_ids[1], None)
    for name in ("embed-only", "head-only"):
        assert not torch.allclose(oracle.logits(prompt_ids[1], name), base, atol=1e-3), name
    full = engine.runner.adapters["vocab-all"]
    assert full.vocab is not None and full.vocab.embed_rows is not None and full.vocab.head is not None
    assert full.vocab.embed_rows.shape == (args.vocab_size, 8)
    assert full.vocab.head.parts[0][4].shape == (8, args.vocab_size)
    head_only = engine.runner.adapters["head-only"]
    assert head_only.vocab is not None and head_only.vocab.embed_rows is None
    assert head_only.num_bytes == 4 * 4 * (args.hidden_size + args.vocab_size)  # fp32 A^T and s B^T


@pytest.mark.parametrize("form", DECODE_LORA_FORMS)
def test_every_lora_form_gives_peft_tokens_for_vocab_lora_alone_and_in_a_mixed_batch_of_16(
    make_engine: Any,
    vocab_dirs: dict[str, Path],
    adapter_dirs: dict[str, Path],
    oracle: HfOracle,
    prompt_ids: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
    form: str,
) -> None:
    served = forms_served_on(form, make_engine, vocab_dirs, adapter_dirs, oracle, prompt_ids, monkeypatch)
    assert any(len(kinds) > 1 and VocabStep in kinds for kinds in served)


@pytest.mark.parametrize("memory_mode", ["unified", "static"])
def test_vocab_lora_in_both_memory_modes_matches_peft(
    make_engine: Any,
    vocab_dirs: dict[str, Path],
    adapter_dirs: dict[str, Path],
    oracle: HfOracle,
    prompt_ids: list[list[int]],
    memory_mode: str,
) -> None:
    """Unified: the vocab tensors live in the adapter's KV pages (the embedding's in the first layer's, the
    head's in the last layer's) and count toward its pages; static: own tensors."""
    engine = engine_with(make_engine, vocab_dirs, memory_mode=memory_mode)
    if memory_mode == "unified":
        transfers = engine.runner.transfers
        caches = engine.runner.kv_caches
        for name, path in vocab_dirs.items():
            adapter = engine.runner.adapters[name]
            info = transfers.validate_adapter(path)
            assert transfers.adapter_num_pages(info) == transfers.num_pages_of(adapter), (
                name
            )  # metadata == tensors
        vocab = engine.runner.adapters["vocab-all"].vocab
        assert vocab is not None and vocab.embed_rows is not None and vocab.head is not None
        first = {t.untyped_storage().data_ptr() for t in caches[0]}
        last = {t.untyped_storage().data_ptr() for t in caches[-1]}
        assert vocab.embed_rows.untyped_storage().data_ptr() in first
        assert vocab.head.parts[0][4].untyped_storage().data_ptr() in last
    assert_peft_tokens(engine, oracle, prompt_ids, mixed_rows(adapter_dirs, vocab_dirs), memory_mode)


def test_vocab_lora_prefill_on_the_host_copy_gives_the_resident_tokens(
    make_engine: Any, vocab_dirs: dict[str, Path], oracle: HfOracle, prompt_ids: list[list[int]]
) -> None:
    """CPU-assisted prefill: a cold adapter's embedding delta and first layer come from its host copy."""
    assert_host_copy_prefill_gives_peft_tokens(
        make_engine, "vocab-rs", vocab_dirs["vocab-rs"], oracle, prompt_ids[3]
    )


def test_prompt_logprobs_of_a_vocab_lora_adapter_match_peft_through_chunks(
    make_engine: Any, vocab_dirs: dict[str, Path], oracle: HfOracle, prompt_ids: list[list[int]]
) -> None:
    """The head delta also reaches the prompt rows' logprobs (their rows of the step, not the sampled ones),
    chunk after chunk, beside a plain LoRA row."""
    engine = engine_with(make_engine, vocab_dirs, max_num_batched_tokens=16)  # 3 chunks of a 40-token prompt
    prompt = (prompt_ids[0] + prompt_ids[1] + prompt_ids[2] + prompt_ids[3])[:40]
    asking = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=1)
    [out, _] = engine.generate(
        [prompt, prompt_ids[1]], [asking, GREEDY], adapter_ids=["vocab-rs", "adapter-00"]
    )
    oracle.model.set_adapter("vocab-rs")
    with torch.inference_mode():
        logits = oracle.model(input_ids=torch.tensor([prompt])).logits[0]
    expected = torch.log_softmax(logits.float(), dim=-1)
    assert out.prompt_logprobs is not None
    for position, got in enumerate(out.prompt_logprobs[1:]):
        assert got is not None and got.token_id == prompt[position + 1]
        assert got.logprob == pytest.approx(float(expected[position, got.token_id]), abs=1e-4)
