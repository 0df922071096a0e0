"""The vLLM backend's mapping, without vLLM: each sampling parameter reaches vLLM's SamplingParams under vLLM's
name, and vLLM's per-token logprob dicts become the platform's TokenLogprobs (top k by rank, the sampled token's
own logprob whatever its rank), sliced per streamed delta; a cumulative logprob asks vLLM for logprobs and
passes vLLM's sum on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpu_workers.worker.vllm_backend import cumulative_logprob, new_logprobs
from gpu_workers.worker.vllm_sampling import (
    logprobs_from_vllm,
    prompt_logprobs_from_vllm,
    vllm_sampling_params,
)
from scheduler.core.sampling import SamplingParams, TokenLogprob


def _lp(logprob: float, rank: int) -> Any:
    return SimpleNamespace(logprob=logprob, rank=rank, decoded_token=None)


def test_every_parameter_reaches_vllm_under_its_name() -> None:
    params = SamplingParams(
        max_tokens=9, temperature=0.7, top_p=0.9, top_k=4, seed=3, stop_token_ids=(5,), stop=("x",),
        ignore_eos=True, min_tokens=2, presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2,
        logit_bias={7: -100.0}, logprobs=4, prompt_logprobs=2,
    )  # fmt: skip
    got = vllm_sampling_params(params, dict)
    assert got == {
        "max_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": 4, "seed": 3, "stop_token_ids": [5],
        "stop": ["x"], "ignore_eos": True, "min_tokens": 2, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "repetition_penalty": 1.2, "logit_bias": {7: -100.0}, "logprobs": 4, "prompt_logprobs": 2,
    }  # fmt: skip
    assert vllm_sampling_params(SamplingParams(), dict)["logit_bias"] is None


def test_vllm_logprobs_become_top_k_by_rank_with_the_sampled_tokens_own() -> None:
    entries = [
        {11: _lp(-0.1, 1), 12: _lp(-2.5, 2)},  # sampled = rank 1
        {20: _lp(-0.3, 1), 21: _lp(-1.7, 2), 99: _lp(-6.0, 9)},  # sampled outside the top 2
    ]
    got = logprobs_from_vllm([11, 99], entries, num_top=2)
    assert got == [
        TokenLogprob(11, -0.1, ((11, -0.1), (12, -2.5))),
        TokenLogprob(99, -6.0, ((20, -0.3), (21, -1.7))),
    ]
    assert logprobs_from_vllm([11], entries[:1], num_top=0) == [TokenLogprob(11, -0.1, ())]


def test_a_streamed_delta_gets_the_logprobs_of_its_own_new_tokens() -> None:
    entries = [{t: _lp(-float(t), 1)} for t in (1, 2, 3)]
    completion = SimpleNamespace(logprobs=entries)  # cumulative, like token_ids
    got = new_logprobs(completion, [2, 3], num_sent=3, num_top=0)
    assert [g.token_id for g in got or []] == [2, 3]
    assert new_logprobs(completion, [2, 3], num_sent=3, num_top=None) is None


def test_vllm_prompt_logprobs_keep_the_first_tokens_none() -> None:
    entries = [None, {7: _lp(-1.0, 2), 8: _lp(-0.5, 1)}, {9: _lp(-0.2, 1)}]
    got = prompt_logprobs_from_vllm([1, 7, 9], entries, num_top=1)
    assert got == [None, TokenLogprob(7, -1.0, ((8, -0.5),)), TokenLogprob(9, -0.2, ((9, -0.2),))]
    assert prompt_logprobs_from_vllm([1, 7, 9], entries, num_top=None) is None


def test_a_cumulative_logprob_asks_vllm_for_logprobs_and_is_passed_on_only_when_asked() -> None:
    summed = SamplingParams(needs_cumulative_logprob=True)
    assert vllm_sampling_params(summed, dict)["logprobs"] == 0  # vLLM sums only for requests with logprobs
    assert (
        vllm_sampling_params(SamplingParams(logprobs=3, needs_cumulative_logprob=True), dict)["logprobs"] == 3
    )
    assert vllm_sampling_params(SamplingParams(), dict)["logprobs"] is None
    completion = SimpleNamespace(cumulative_logprob=-4.25)
    assert cumulative_logprob(completion, summed) == -4.25
    assert cumulative_logprob(completion, SamplingParams(logprobs=0)) is None
    assert cumulative_logprob(SimpleNamespace(cumulative_logprob=None), summed) is None
