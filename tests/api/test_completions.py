"""Inference routes over HTTP with scripted workers: request handling, routing, retries, metering, errors.

The real-worker end-to-end tests are in test_completions_e2e.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import openai
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session

from api.prompting import BaseModelTokenizer
from api.request_meter import REQUEST_STAGES
from tests.api.conftest import ADMIN, TenantHandle
from tests.api.test_completions_support import (
    BASE_MODEL,
    ScriptedWorkers,
    complete,
    delta,
    final,
    sse_events,
    tokens_events,
    usage_rows,
)


def test_completion_returns_worker_text_with_usage_and_meters_one_ok_row(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    tokenizer: BaseModelTokenizer,
) -> None:
    worker = workers.add("w1", events=tokens_events(3))
    response = complete(client, tenant, max_tokens=3, temperature=0, seed=7, stop=["zz"])
    assert response.status_code == 200, response.text
    body = response.json()
    num_prompt = len(tokenizer.encode("hello world"))
    assert body["object"] == "text_completion" and body["model"] == BASE_MODEL
    assert body["choices"][0]["text"] == "t0 t1 t2 " and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": num_prompt,
        "completion_tokens": 3,
        "total_tokens": num_prompt + 3,
    }
    sent = worker.requests[0]
    assert sent.prompt_token_ids == tokenizer.encode("hello world") and sent.adapter is None
    assert (sent.sampling.max_tokens, sent.sampling.temperature, sent.sampling.seed) == (3, 0, 7)
    assert sent.sampling.stop == ["zz"] and sent.tenant_id == tenant.id
    assert worker.auth_headers == ["Bearer test-internal-token"]
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens, row.worker_id) == (
        "ok",
        num_prompt,
        3,
        "w1",
    )
    assert row.request_id == sent.request_id and row.model_name == BASE_MODEL
    assert row.ttft_ms is not None and row.tpot_ms is not None and row.e2e_ms >= row.ttft_ms


def test_chat_renders_the_base_model_template_and_sends_its_token_ids(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    tokenizer: BaseModelTokenizer,
) -> None:
    worker = workers.add("w1")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    response = client.post(
        "/v1/chat/completions",
        json={"model": BASE_MODEL, "messages": messages, "max_completion_tokens": 5},
        headers=tenant.headers,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "t0 t1 t2 "}
    text, ids = tokenizer.encode_chat(messages)
    assert text == "<|system|>\nbe brief</s>\n<|user|>\nhello</s>\n<|assistant|>\n"
    assert worker.requests[0].prompt_token_ids == ids and worker.requests[0].sampling.max_tokens == 5


def test_stream_sends_sse_chunks_then_usage_then_done_with_the_row_written(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    workers.add("w1", events=tokens_events(4, finish_reason="stop"))
    body = {
        "model": BASE_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=body, headers=tenant.headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.read().decode())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert (
        "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "t0 t1 t2 t3 "
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens) == ("ok", 4)
    assert row.prompt_tokens == chunks[-1]["usage"]["prompt_tokens"] > 0


def test_a_stream_ends_with_the_last_finish_chunk_usage_and_done_in_the_bodys_last_message(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
) -> None:
    """One socket write ends a stream: the finish chunk, the usage chunk and [DONE] go in the ASGI message that
    ends the body (api/inference/streamed_response.py StreamEnd), after the usage row is final; every token chunk
    went on its own before."""
    workers.add("w1", events=tokens_events(3, finish_reason="length"))
    body = {"model": BASE_MODEL, "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json")]
        + [(k.lower().encode(), v.encode()) for k, v in tenant.headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    messages: list[dict[str, Any]] = []
    requests = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
        await anyio.sleep_forever()  # the client stays (its listener is cancelled when the response ends)
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    assert client.portal is not None
    client.portal.call(client.app, scope, receive, send)
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
    bodies = messages[1:]
    assert [m["more_body"] for m in bodies] == [True] * (len(bodies) - 1) + [False]
    *token_chunks, end = [sse_events(m["body"].decode()) for m in bodies]
    assert [len(events) for events in token_chunks] == [1, 1, 1]  # each token its own write
    finish, usage, done = end
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    assert done == "[DONE]"


def test_openai_client_plain_streaming_and_typed_errors(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
) -> None:
    workers.add("w1", events=tokens_events(2))
    oai = openai.OpenAI(
        api_key=tenant.key, base_url="http://testserver/v1", http_client=client, max_retries=0
    )
    completion = oai.completions.create(model=BASE_MODEL, prompt="hello", max_tokens=2)
    assert completion.choices[0].text == "t0 t1 " and completion.usage.completion_tokens == 2
    chat = oai.chat.completions.create(
        model=BASE_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert chat.choices[0].message.content == "t0 t1 " and chat.usage.total_tokens > 2
    stream = oai.chat.completions.create(
        model=BASE_MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "t0 t1 "
    assert chunks[-1].usage.completion_tokens == 2
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="no-such-adapter", prompt="hello")
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        oai.completions.create(model=BASE_MODEL, prompt="hello", logit_bias={"99999999": 1.0})
    bad_key = openai.OpenAI(
        api_key="lh_wrong", base_url="http://testserver/v1", http_client=client, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        bad_key.completions.create(model=BASE_MODEL, prompt="hello")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("best_of", 9),  # above the default plan's max_n
        ("suffix", "x"),
        ("tools", [{"type": "function"}]),
        ("not_a_field", 1),
    ],
)
def test_unsupported_field_is_a_400_naming_it_and_metered_rejected(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    field: str,
    value: object,
) -> None:
    worker = workers.add("w1")
    response = complete(client, tenant, **{field: value})
    assert response.status_code == 400
    assert (
        response.json()["error"]["type"] == "invalid_request" and field in response.json()["error"]["message"]
    )
    assert worker.requests == []
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("rejected", 0, 0)


@pytest.mark.parametrize(
    ("overrides", "body", "expected"),
    [
        ({"max_prompt_tokens": 3}, {"prompt": "one two three four five six"}, "the limit is 3 tokens"),
        ({"max_completion_tokens": 8}, {"max_tokens": 9}, "above the limit of 8"),
        ({}, {"max_tokens": 1020, "prompt": "one two three four five six"}, "context of 1024 tokens"),
        ({}, {"prompt": ["a", "b"]}, "batches of prompts are not supported"),
        ({}, {"prompt": [1, 99999]}, "not a token id"),
        ({}, {"temperature": 5}, "temperature"),
    ],
)
def test_size_and_value_limits_are_400s_that_say_the_limit(
    make_client: Callable[..., TestClient],
    new_tenant: Callable[[str], TenantHandle],
    db_session: Session,
    overrides: dict[str, int],
    body: dict[str, object],
    expected: str,
) -> None:
    client = make_client(**overrides)
    ScriptedWorkers().install(client)
    tenant = new_tenant("sizes")
    response = complete(client, tenant, **body)
    assert response.status_code == 400 and expected in response.json()["error"]["message"], response.text
    assert [r.status for r in usage_rows(db_session, tenant.id)] == ["rejected"]


def test_token_id_prompts_are_accepted(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    worker = workers.add("w1")
    assert complete(client, tenant, prompt=[5, 6, 7]).status_code == 200
    assert complete(client, tenant, prompt=[[8, 9]]).status_code == 200
    assert [r.prompt_token_ids for r in worker.requests] == [[5, 6, 7], [8, 9]]


def test_final_event_without_tokens_is_ok_with_zero_completion(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    workers.add("w1", events=[final(finish_reason="stop")])
    body = complete(client, tenant).json()
    assert body["choices"][0]["text"] == "" and body["choices"][0]["finish_reason"] == "stop"
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens, row.ttft_ms) == ("ok", 0, None)


def test_stream_sends_a_chunk_for_every_token_delta_even_with_empty_text(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    events = [delta("", 2), delta("", 3), delta("ok", 4), final(0, 3)]
    workers.add("w1", events=events)
    with client.stream(
        "POST",
        "/v1/completions",
        headers=tenant.headers,
        json={"model": BASE_MODEL, "prompt": "hi", "max_tokens": 3, "stream": True},
    ) as response:
        chunks = sse_events(response.read().decode())[:-1]
    assert [c["choices"][0]["text"] for c in chunks] == ["", "", "ok", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]


def test_chat_stream_sends_a_content_chunk_for_every_token_delta_even_with_empty_text(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    workers.add("w1", events=[delta("", 2), delta("", 3), delta("ok", 4), final(0, 3)])
    body = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body, headers=tenant.headers) as response:
        chunks = sse_events(response.read().decode())[:-1]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": ""},
        {"content": "ok"},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_vllm_ignore_eos_and_min_tokens_are_forwarded(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, path: str
) -> None:
    worker = workers.add("w1")
    prompt = (
        {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    )
    body = {"model": BASE_MODEL, **prompt, "max_tokens": 3}
    assert client.post(
        path, json=body | {"ignore_eos": True, "min_tokens": 3}, headers=tenant.headers
    ).is_success
    assert client.post(path, json=body | {"min_tokens": 2, "stop": ["x"]}, headers=tenant.headers).is_success
    assert [r.sampling.ignore_eos for r in worker.requests] == [True, False]
    assert [r.sampling.min_tokens for r in worker.requests] == [3, 2]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"min_tokens": 5, "ignore_eos": True}, "above max_tokens=3"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"ignore_eos": "sometimes"}, "ignore_eos"),
    ],
)
def test_min_tokens_above_max_tokens_is_a_400_saying_why(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    extra: dict[str, object],
    expected: str,
) -> None:
    worker = workers.add("w1")
    response = complete(client, tenant, max_tokens=3, **extra)
    assert response.status_code == 400 and expected in response.json()["error"]["message"], response.text
    assert worker.requests == []


def test_each_stage_before_the_first_token_is_observed_once_per_served_request(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    workers.add("w1", events=tokens_events(3))
    body = {"model": BASE_MODEL, "prompt": "hi", "max_tokens": 3, "stream": True}
    with client.stream("POST", "/v1/completions", headers=tenant.headers, json=body) as response:
        assert response.status_code == 200
        response.read()
    refused = client.post("/v1/completions", headers=tenant.headers, json=body | {"model": "no-such-model"})
    assert refused.status_code == 404
    counts = {
        sample.labels["stage"]: sample.value
        for family in text_string_to_metric_families(client.get("/metrics", headers=ADMIN).text)
        for sample in family.samples
        if sample.name == "lorahost_request_stage_ms_count"
    }
    assert counts == dict.fromkeys(REQUEST_STAGES, 1.0)  # the refused request passed no stage to its end
