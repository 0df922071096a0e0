"""Sampling features on the engine, per row of a mixed-adapter batch: logprobs equal transformers + peft's
log_softmax (base model and adapters), a seeded request gives the same tokens alone or among 16 mixed
requests, rows with penalties, bias or min_tokens beside rows without get what they would get alone, and a
row's cumulative logprob is the sum of its sampled tokens' logprobs whether it shows them or not."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.sampling import SamplingParams

NUM_TOKENS = 6


@pytest.mark.parametrize("adapter", [None, "adapter-00", "adapter-03"])
def test_greedy_logprobs_match_peft_log_softmax(
    fp32_engine: LLMEngine, hf_oracle: Any, prompt_ids: list[list[int]], adapter: str | None
) -> None:
    prompt = prompt_ids[2]
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0, ignore_eos=True, logprobs=5)
    [out] = fp32_engine.generate([prompt], params, adapter_ids=[adapter])
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == NUM_TOKENS
    ids = list(prompt)
    for token, logprob in zip(out.token_ids, out.logprobs):
        expected = torch.log_softmax(hf_oracle.logits(ids, adapter), dim=-1)
        assert logprob.token_id == token
        assert logprob.logprob == pytest.approx(float(expected[token]), abs=1e-4)
        top_values, top_ids = expected.topk(5)
        assert [t for t, _ in logprob.top] == top_ids.tolist()
        assert [v for _, v in logprob.top] == pytest.approx(top_values.tolist(), abs=1e-4)
        ids.append(token)


def test_seeded_request_gives_the_same_tokens_alone_and_in_a_mixed_batch_of_16(
    fp32_engine: LLMEngine, prompt_ids: list[list[int]], adapter_dirs: dict
) -> None:
    seeded = SamplingParams(max_tokens=NUM_TOKENS, temperature=1.0, seed=1234, ignore_eos=True)
    [alone] = fp32_engine.generate([prompt_ids[0]], seeded, adapter_ids=["adapter-01"])
    names = list(adapter_dirs)
    prompts: list[list[int]] = [prompt_ids[i % len(prompt_ids)] for i in range(15)]
    adapters: list[str | None] = [None if i % 4 == 0 else names[i % len(names)] for i in range(15)]
    others = [
        SamplingParams(max_tokens=NUM_TOKENS + i % 3, temperature=0.3 * (i % 4), seed=i if i % 2 else None,
                       top_k=i % 5, presence_penalty=0.5 * (i % 3), logprobs=i % 3 or None, ignore_eos=True)
        for i in range(15)
    ]  # fmt: skip
    outs = fp32_engine.generate(
        [*prompts[:7], prompt_ids[0], *prompts[7:]],
        [*others[:7], seeded, *others[7:]],
        adapter_ids=[*adapters[:7], "adapter-01", *adapters[7:]],
    )
    assert outs[7].token_ids == alone.token_ids


def test_rows_with_processors_get_what_they_get_alone_beside_rows_without(
    fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    greedy: dict[str, Any] = {"max_tokens": NUM_TOKENS, "temperature": 0, "ignore_eos": True}
    params = [
        SamplingParams(**greedy),
        SamplingParams(**greedy, repetition_penalty=1.8, logprobs=2),
        SamplingParams(**greedy, frequency_penalty=2.0, presence_penalty=1.0),
        SamplingParams(**greedy, logit_bias={5: 100.0}),
        SamplingParams(max_tokens=NUM_TOKENS, temperature=0, min_tokens=NUM_TOKENS, logprobs=0),
    ]
    adapters: list[str | None] = [None, "adapter-00", "adapter-01", "adapter-02", None]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(params))]
    alone = [fp32_engine.generate([p], s, adapter_ids=[a])[0] for p, s, a in zip(prompts, params, adapters)]
    mixed = fp32_engine.generate(prompts, params, adapter_ids=adapters)
    for one, together in zip(alone, mixed):
        assert together.token_ids == one.token_ids
        if one.logprobs is not None:
            assert together.logprobs is not None
            for a, b in zip(one.logprobs, together.logprobs):
                assert b.token_id == a.token_id and b.logprob == pytest.approx(a.logprob, abs=1e-4)
    assert mixed[3].token_ids == [5] * NUM_TOKENS  # +100 on token 5 always wins
    assert mixed[0].logprobs is None


def test_min_tokens_holds_back_eos_until_reached(fp32_engine: LLMEngine, prompt_ids: list[list[int]]) -> None:
    eos = next(iter(fp32_engine.eos_token_ids))
    bias_to_eos = {eos: 100.0}  # EOS would be the first token
    [early] = fp32_engine.generate(
        [prompt_ids[0]], SamplingParams(max_tokens=8, temperature=0, logit_bias=bias_to_eos)
    )
    assert early.token_ids == [eos] and early.finish_reason == "stop"
    held = SamplingParams(max_tokens=8, temperature=0, logit_bias=bias_to_eos, min_tokens=3)
    [out] = fp32_engine.generate([prompt_ids[0]], held)
    assert len(out.token_ids) == 4 and out.token_ids[-1] == eos and eos not in out.token_ids[:3]
    assert out.finish_reason == "stop"


def peft_prompt_logprobs(hf_oracle: Any, prompt: list[int], adapter: str | None) -> torch.Tensor:
    """log_softmax at every prompt position [len(prompt), vocab] by transformers + peft."""
    x = torch.tensor([prompt])
    with torch.inference_mode():
        if adapter is None:
            with hf_oracle.model.disable_adapter():
                logits = hf_oracle.model(input_ids=x).logits[0]
        else:
            hf_oracle.model.set_adapter(adapter)
            logits = hf_oracle.model(input_ids=x).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("adapter", [None, "adapter-02"])
def test_prompt_logprobs_match_peft_through_chunks_and_a_warm_prefix_cache(
    make_engine: Any, hf_oracle: Any, prompt_ids: list[list[int]], adapter: str | None
) -> None:
    engine = make_engine(max_num_batched_tokens=16)  # a 40-token prompt runs in 3 chunks
    prompt = (prompt_ids[0] + prompt_ids[1] + prompt_ids[2] + prompt_ids[3])[:40]
    plain = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    engine.generate([prompt], plain, adapter_ids=[adapter])  # its full blocks are now cached
    asking = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=2, logprobs=0)
    [out, neighbour] = engine.generate([prompt, prompt_ids[1]], [asking, plain], adapter_ids=[adapter, None])
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
    assert out.prompt_logprobs[0] is None and neighbour.prompt_logprobs is None
    expected = peft_prompt_logprobs(hf_oracle, prompt, adapter)
    for position, got in enumerate(out.prompt_logprobs[1:]):
        assert got is not None and got.token_id == prompt[position + 1]
        assert got.logprob == pytest.approx(float(expected[position, got.token_id]), abs=1e-4)
        assert [t for t, _ in got.top] == expected[position].topk(2).indices.tolist()
    assert out.logprobs is not None and out.token_ids == [lp.token_id for lp in out.logprobs]


def test_cumulative_logprob_sums_the_sampled_tokens_logprobs_shown_or_not(
    fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    sampled = {"max_tokens": NUM_TOKENS, "temperature": 1.0, "seed": 77, "ignore_eos": True}
    sampled |= {"presence_penalty": 0.5}  # the processed distribution, before temperature
    shown, summed, plain = fp32_engine.generate(
        [prompt_ids[1]] * 3,
        [
            SamplingParams(**sampled, logprobs=0, needs_cumulative_logprob=True),
            SamplingParams(**sampled, needs_cumulative_logprob=True),
            SamplingParams(**sampled),
        ],
        adapter_ids=["adapter-00"] * 3,
    )
    assert shown.token_ids == summed.token_ids == plain.token_ids  # one seed: the same samples
    assert shown.logprobs is not None and summed.logprobs is None
    assert shown.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in shown.logprobs), abs=1e-5)
    assert summed.cumulative_logprob == pytest.approx(shown.cumulative_logprob, abs=1e-5)
    assert plain.cumulative_logprob is None
