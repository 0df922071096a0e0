"""The oracle: greedy tokens and logits equal transformers + peft, per adapter alone and all mixed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import BatchEntry, Sequence

NUM_TOKENS = 8
GREEDY = SamplingParams(max_tokens=NUM_TOKENS, temperature=0, ignore_eos=True)


def engine_prefill_logits(
    engine: LLMEngine, prompts: list[list[int]], adapters: list[str | None]
) -> torch.Tensor:
    """Logits [n, vocab] of one batched prefill of `prompts` (pages allocated and freed here)."""
    seqs = [
        Sequence(f"logits-{i}", p, GREEDY, a, NUM_TOKENS) for i, (p, a) in enumerate(zip(prompts, adapters))
    ]
    for seq in seqs:
        seq.block_table = engine.pool.allocate(engine.pool.num_blocks_for_tokens(seq.num_tokens))
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].adapter_id or "")
    try:
        _, logits = engine.runner.execute([BatchEntry(seqs[i], seqs[i].num_tokens) for i in order], True)
    finally:
        for seq in seqs:
            engine.pool.free(seq.block_table)
    assert logits is not None
    result = torch.empty_like(logits, device="cpu")  # on the CPU, beside the oracle's
    result[torch.tensor(order)] = logits.cpu()
    return result


@pytest.mark.parametrize(
    "adapter", [None, "adapter-00", "adapter-01", "adapter-02", "adapter-03", "adapter-04"]
)
def test_greedy_tokens_match_peft_for_each_adapter_alone(
    fp32_engine: LLMEngine, hf_oracle: Any, prompt_ids: list[list[int]], adapter: str | None
) -> None:
    prompt = prompt_ids[1]
    [out] = fp32_engine.generate([prompt], GREEDY, adapter_ids=[adapter])
    assert out.token_ids == hf_oracle.greedy(prompt, adapter, NUM_TOKENS)


def test_mixed_batch_of_all_adapters_and_base_matches_peft(
    fp32_engine: LLMEngine, hf_oracle: Any, prompt_ids: list[list[int]], adapter_dirs: dict
) -> None:
    adapters: list[str | None] = [None, *adapter_dirs, None, *reversed(list(adapter_dirs))]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    outs = fp32_engine.generate(prompts, GREEDY, adapter_ids=adapters)
    for prompt, adapter, out in zip(prompts, adapters, outs):
        assert out.token_ids == hf_oracle.greedy(prompt, adapter, NUM_TOKENS), adapter


def test_fp32_logits_match_peft_tightly(
    fp32_engine: LLMEngine, hf_oracle: Any, prompt_ids: list[list[int]], adapter_dirs: dict
) -> None:
    adapters: list[str | None] = [None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    logits = engine_prefill_logits(fp32_engine, prompts, adapters)
    for i, (prompt, adapter) in enumerate(zip(prompts, adapters)):
        torch.testing.assert_close(logits[i], hf_oracle.logits(prompt, adapter), atol=1e-4, rtol=1e-4)


def test_lora_changes_the_logits(fp32_engine: LLMEngine, prompt_ids: list[list[int]]) -> None:
    logits = engine_prefill_logits(fp32_engine, [prompt_ids[0]] * 2, [None, "adapter-00"])
    assert (logits[0] - logits[1]).abs().max() > 1e-2


def test_bf16_logits_match_peft_loosely(
    make_engine: Any, hf_oracle: Any, prompt_ids: list[list[int]], adapter_dirs: dict
) -> None:
    engine = make_engine(dtype="bfloat16")
    adapters: list[str | None] = [None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    logits = engine_prefill_logits(engine, prompts, adapters)
    for i, (prompt, adapter) in enumerate(zip(prompts, adapters)):
        expected = hf_oracle.logits(prompt, adapter)
        assert (logits[i] - expected).abs().max() < 0.05 * expected.abs().max() + 0.05


def test_stacked_decode_lora_matches_segment_loop_and_peft(
    make_engine: Any, hf_oracle: Any, prompt_ids: list[list[int]], adapter_dirs: dict
) -> None:
    """In the stacked LoRA form, decode steps of a mixed batch use stacked adapter sets (cached per adapter
    set); the segmented form gives the same tokens, and both equal peft."""
    adapters: list[str | None] = [*adapter_dirs, None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    stacked = make_engine(decode_lora_form="stacked")
    outs = stacked.generate(prompts, GREEDY, adapter_ids=adapters)
    builds = stacked.runner_stats().num_lora_stack_builds
    assert builds >= 1
    assert builds < NUM_TOKENS  # reused across decode steps of the same batch composition
    assert stacked.runner_stats().lora_stack_bytes > 0
    looped = make_engine(decode_lora_form="segmented")
    outs_loop = looped.generate(prompts, GREEDY, adapter_ids=adapters)
    assert looped.runner_stats().num_lora_stack_builds == 0
    for prompt, adapter, out, out_loop in zip(prompts, adapters, outs, outs_loop):
        assert out.token_ids == out_loop.token_ids == hf_oracle.greedy(prompt, adapter, NUM_TOKENS), adapter


def test_stacked_lora_cache_drops_unloaded_adapters(make_engine: Any, prompt_ids: list[list[int]]) -> None:
    engine = make_engine(decode_lora_form="stacked")
    names = engine.loaded_adapters()[:3]
    engine.generate([prompt_ids[0]] * 3, GREEDY, adapter_ids=names)
    assert engine.runner.lora_forms.lora_stacks
    engine.unload_adapter(names[0])
    assert not any(
        a.adapter_id == names[0] for s in engine.runner.lora_forms.lora_stacks.values() for a in s.adapters
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_linears_match_peft(
    make_engine: Any, hf_oracle: Any, prompt_ids: list[list[int]], adapter_dirs: dict, dtype: str
) -> None:
    """oneDNN-packed weights (projections, LM head, stacked decode LoRA) give the same results."""
    from gpu_workers.engine.layers.linear import can_pack_linear

    if not can_pack_linear(getattr(torch, dtype), torch.device("cpu")):
        pytest.skip("oneDNN packed linear is not available for this dtype here")
    engine = make_engine(dtype=dtype, packed_linears=True, decode_lora_form="stacked", device="cpu")
    assert engine.runner.use_packed_linears
    adapters: list[str | None] = [None, *adapter_dirs, None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    logits = engine_prefill_logits(
        engine, prompts[: len(adapter_dirs) + 1], adapters[: len(adapter_dirs) + 1]
    )
    for i, (prompt, adapter) in enumerate(zip(prompts, adapters[: len(adapter_dirs) + 1])):
        expected = hf_oracle.logits(prompt, adapter)
        if dtype == "float32":
            torch.testing.assert_close(logits[i], expected, atol=1e-4, rtol=1e-4)
        else:
            assert (logits[i] - expected).abs().max() < 0.05 * expected.abs().max() + 0.05
    if dtype == "float32":
        outs = engine.generate(prompts, GREEDY, adapter_ids=adapters)
        assert engine.runner_stats().num_lora_stack_builds >= 1
        for prompt, adapter, out in zip(prompts, adapters, outs):
            assert out.token_ids == hf_oracle.greedy(prompt, adapter, NUM_TOKENS), adapter
