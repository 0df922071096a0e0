"""Sampling parameters and logprobs through the API with scripted workers: each field reaches the worker's
SamplingSpec, logprobs come back in OpenAI's completions and chat shapes (the official client parses them),
streamed and not, out-of-range values are 400s naming the field, and logprobs add nothing to the bill."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.prompting import BaseModelTokenizer
from tests.api.conftest import TenantHandle
from tests.api.test_completions_support import (
    BASE_MODEL,
    ScriptedWorkers,
    complete,
    final,
    sse_events,
    usage_rows,
)

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
TOKENS = [10, 11, 12]


def logprob_events(num_top: int) -> list[dict[str, Any]]:
    """Three deltas of one token each, with their logprob and `num_top` alternatives, then a final."""
    events: list[dict[str, Any]] = []
    for i, token in enumerate(TOKENS):
        top = [[token, -0.5 - i], [40 + i, -1.5 - i], [50 + i, -2.5 - i]][:num_top]
        lp = {"token_id": token, "logprob": -0.5 - i, "top": top}
        events.append({"type": "delta", "text": f"t{i} ", "token_ids": [token], "logprobs": [lp]})
    return [*events, final(0, len(TOKENS))]


def post(client: TestClient, tenant: TenantHandle, path: str, **body: Any) -> Any:
    """POST to `path` as `tenant`: a completion of "hello world" or a chat of CHAT, with `body`'s fields."""
    prompt = CHAT if path == "/v1/chat/completions" else {"prompt": "hello world"}
    return client.post(path, json={"model": BASE_MODEL, **prompt, **body}, headers=tenant.headers)


def _client(client: TestClient, tenant: TenantHandle) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=tenant.key, base_url="http://testserver/v1", http_client=client, max_retries=0
    )


def test_every_sampling_field_reaches_the_worker(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    worker = workers.add("w1")
    fields = {
        "presence_penalty": 0.5, "frequency_penalty": -1.0, "repetition_penalty": 1.3, "logit_bias": {"7": -100},
        "min_tokens": 2, "stop_token_ids": [9], "ignore_eos": True, "seed": 5, "max_tokens": 3,
    }  # fmt: skip
    first = complete(client, tenant, logprobs=4, **fields)
    assert first.status_code == 200, first.text
    second = post(client, tenant, "/v1/chat/completions", logprobs=True, top_logprobs=3, **fields)
    assert second.is_success, second.text
    assert post(client, tenant, "/v1/chat/completions", logprobs=True).is_success
    text, chat, chat_no_top = (r.sampling for r in worker.requests)
    assert (text.presence_penalty, text.frequency_penalty, text.repetition_penalty) == (0.5, -1.0, 1.3)
    assert (text.logit_bias, text.min_tokens, text.stop_token_ids, text.ignore_eos) == (
        {7: -100.0},
        2,
        [9],
        True,
    )
    assert (text.logprobs, chat.logprobs, chat_no_top.logprobs) == (4, 3, 0)
    assert chat.logit_bias == {7: -100.0}


def test_completion_logprobs_in_openais_legacy_shape(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    tokenizer: BaseModelTokenizer,
    db_session: Session,
) -> None:
    workers.add("w1", events=logprob_events(2))
    completion = _client(client, tenant).completions.create(model=BASE_MODEL, prompt="hello", logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    texts = [tokenizer.token_text(t) for t in TOKENS]
    assert logprobs.tokens == texts
    assert logprobs.token_logprobs == [-0.5, -1.5, -2.5]
    assert logprobs.text_offset == [0, len(texts[0]), len(texts[0]) + len(texts[1])]
    assert logprobs.top_logprobs is not None
    assert logprobs.top_logprobs[1] == {texts[1]: -1.5, tokenizer.token_text(41): -2.5}
    assert completion.usage is not None and completion.usage.completion_tokens == len(TOKENS)
    [row] = usage_rows(db_session, tenant.id)  # logprobs add nothing to the bill
    assert (row.status, row.completion_tokens) == ("ok", len(TOKENS))


def test_completion_logprobs_streamed_keep_their_text_offsets(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, tokenizer: BaseModelTokenizer
) -> None:
    workers.add("w1", events=logprob_events(1))
    response = complete(client, tenant, logprobs=1, stream=True)
    chunks = [c for c in sse_events(response.text) if c != "[DONE]" and c["choices"]]
    blocks = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    assert [b["tokens"] for b in blocks] == [[tokenizer.token_text(t)] for t in TOKENS]
    lengths = [len(tokenizer.token_text(t)) for t in TOKENS]
    assert [b["text_offset"] for b in blocks] == [[0], [lengths[0]], [lengths[0] + lengths[1]]]


@pytest.mark.parametrize("is_stream", [False, True])
def test_chat_logprobs_in_openais_shape(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    tokenizer: BaseModelTokenizer,
    is_stream: bool,
) -> None:
    workers.add("w1", events=logprob_events(3))
    oai = _client(client, tenant)
    args: dict[str, Any] = {"model": BASE_MODEL, "logprobs": True, "top_logprobs": 3, **CHAT}
    if is_stream:
        chunks = list(oai.chat.completions.create(stream=True, **args))
        content = [
            e
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content or []
        ]
    else:
        chat = oai.chat.completions.create(**args)
        assert chat.choices[0].logprobs is not None
        content = chat.choices[0].logprobs.content or []
    assert [e.token for e in content] == [tokenizer.token_text(t) for t in TOKENS]
    assert [e.logprob for e in content] == [-0.5, -1.5, -2.5]
    assert content[0].bytes == list(tokenizer.token_text(TOKENS[0]).encode())
    assert [t.logprob for t in content[2].top_logprobs] == [-2.5, -3.5, -4.5]
    assert content[2].top_logprobs[1].token == tokenizer.token_text(42)


def test_without_logprobs_the_choice_has_none(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    workers.add("w1", events=logprob_events(0))
    body = complete(client, tenant).json()
    assert body["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("path", "extra", "field"),
    [
        ("/v1/completions", {"presence_penalty": 2.5}, "presence_penalty"),
        ("/v1/completions", {"frequency_penalty": -3}, "frequency_penalty"),
        ("/v1/completions", {"repetition_penalty": 0}, "repetition_penalty"),
        ("/v1/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
        ("/v1/completions", {"logit_bias": {"five": 1}}, "logit_bias"),
        ("/v1/completions", {"logit_bias": {"99999999": 1}}, "logit_bias"),
        ("/v1/completions", {"stop_token_ids": [99999999]}, "stop_token_ids"),
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
        ("/v1/completions", {"logprobs": -1}, "logprobs"),
        ("/v1/completions", {"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/completions", {"n": 0}, "n: "),
        ("/v1/completions", {"suffix": "x"}, "suffix"),
        ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools"),
    ],
)
def test_out_of_range_or_unbuilt_values_are_400s_naming_the_field(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    path: str,
    extra: dict[str, Any],
    field: str,
) -> None:
    worker = workers.add("w1")
    response = post(client, tenant, path, **extra)
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"]
    assert worker.requests == []


def echo_events(prompt_ids: list[int]) -> list[dict[str, Any]]:
    """logprob_events(1) whose first delta carries the prompt's logprobs (None first)."""
    events = logprob_events(1)
    prompt = [None] + [{"token_id": t, "logprob": -3.0, "top": [[t, -3.0]]} for t in prompt_ids[1:]]
    events[0]["prompt_logprobs"] = prompt
    return events


def test_echo_shows_the_prompt_then_the_completion_with_the_prompts_logprobs(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, tokenizer: BaseModelTokenizer
) -> None:
    prompt_ids = tokenizer.encode("hello world")
    worker = workers.add("w1", events=echo_events(prompt_ids))
    completion = _client(client, tenant).completions.create(
        model=BASE_MODEL, prompt="hello world", echo=True, logprobs=1
    )
    assert completion.choices[0].text == "hello world" + "t0 t1 t2 "
    assert worker.requests[0].sampling.prompt_logprobs == 1
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    texts = [tokenizer.token_text(t) for t in [*prompt_ids, *TOKENS]]
    assert logprobs.tokens == texts
    assert logprobs.token_logprobs == [None] + [-3.0] * (len(prompt_ids) - 1) + [-0.5, -1.5, -2.5]
    assert logprobs.top_logprobs[0] is None and logprobs.top_logprobs[1] == {texts[1]: -3.0}
    assert logprobs.text_offset == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    assert completion.usage is not None and completion.usage.completion_tokens == len(TOKENS)


def test_echo_without_logprobs_and_streamed_leads_with_the_prompt(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    worker = workers.add("w1", events=logprob_events(0))
    assert complete(client, tenant, echo=True).json()["choices"][0]["text"] == "hello worldt0 t1 t2 "
    response = complete(client, tenant, echo=True, stream=True)
    chunks = [c for c in sse_events(response.text) if c != "[DONE]" and c["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "hello worldt0 t1 t2 "
    assert chunks[0]["choices"][0]["text"].startswith("hello world")
    assert [r.sampling.prompt_logprobs for r in worker.requests] == [None, None]
