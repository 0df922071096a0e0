"""Sampling features end to end (the API over uvicorn, a real worker process with the tiny model, the official
`openai` client; the stack of tests/api/test_completions_e2e.py): chat logprobs of an adapter and a completion
echo with prompt logprobs are the same alone and while another tenant's penalised, biased, seeded requests
share the batches; greedy tokens are their own top alternative; nothing about logprobs reaches the bill."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.api.test_completions_e2e import Stack, rows_of, stack

__all__ = ["stack"]  # the e2e stack fixture, used here

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "hi there"}]


def chat_logprobs(stack: Stack, key: str) -> Any:
    return stack.openai(key).chat.completions.create(
        model="scorer", messages=CHAT, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )


def echo_completion(stack: Stack, key: str) -> Any:
    return stack.openai(key).completions.create(
        model="scorer", prompt="hello world", max_tokens=3, temperature=0, echo=True, logprobs=2
    )


def noisy_neighbour(stack: Stack, key: str, i: int) -> Any:
    return stack.openai(key).completions.create(
        model="lorahost-base", prompt="the adapter", max_tokens=6, temperature=1.0, seed=i,
        presence_penalty=1.0, frequency_penalty=0.5, logit_bias={"5": 5.0}, extra_body={"repetition_penalty": 1.2},
    )  # fmt: skip


def test_logprobs_are_the_same_alone_and_beside_another_tenants_sampling(
    stack: Stack, adapter_dirs: dict[str, Path]
) -> None:
    key, other = stack.tenant("e2e-logprobs"), stack.tenant("e2e-neighbour")
    stack.upload(key, "scorer", adapter_dirs["adapter-02"])
    chat_alone, echo_alone = chat_logprobs(stack, key), echo_completion(stack, key)
    with ThreadPoolExecutor(6) as pool:
        neighbours = [pool.submit(noisy_neighbour, stack, other, i) for i in range(4)]
        chat_mixed, echo_mixed = (
            pool.submit(chat_logprobs, stack, key),
            pool.submit(echo_completion, stack, key),
        )
        chat, echo = chat_mixed.result(), echo_mixed.result()
        assert all(n.result().usage.completion_tokens == 6 for n in neighbours)
    content, alone = chat.choices[0].logprobs.content, chat_alone.choices[0].logprobs.content
    assert [c.token for c in content] == [c.token for c in alone] and len(content) == 5
    for got, ref in zip(content, alone):
        assert got.logprob == pytest.approx(ref.logprob, abs=1e-4)
        assert got.top_logprobs[0].logprob == pytest.approx(got.logprob, abs=1e-6)  # greedy: its own top
    logprobs = echo.choices[0].logprobs
    assert echo.choices[0].text == echo_alone.choices[0].text and echo.choices[0].text.startswith(
        "hello world"
    )
    num_prompt = echo.usage.prompt_tokens
    assert len(logprobs.tokens) == num_prompt + 3 and logprobs.token_logprobs[0] is None
    assert logprobs.token_logprobs[1:] == pytest.approx(
        echo_alone.choices[0].logprobs.token_logprobs[1:], abs=1e-4
    )
    rows = rows_of(stack, key)
    assert sorted(r.completion_tokens for r in rows) == [3, 3, 5, 5] and {r.status for r in rows} == {"ok"}
