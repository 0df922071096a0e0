"""Inference routes over HTTP with scripted workers: request handling, routing, retries, metering, errors.

The real-worker end-to-end tests are in test_completions_e2e.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.prompting import BaseModelTokenizer
from tests.api.conftest import TenantHandle
from tests.api.test_completions_support import (
    BASE_MODEL,
    ScriptedWorkers,
    add_ready_version,
    delta,
    final,
    sse_events,
    tokens_events,
    usage_rows,
)


@pytest.fixture
def workers(client: TestClient) -> ScriptedWorkers:
    scripted = ScriptedWorkers()
    scripted.install(client)
    return scripted


@pytest.fixture
def tokenizer(base_model_dir: Path) -> BaseModelTokenizer:
    return BaseModelTokenizer.load(base_model_dir)


def complete(
    client: TestClient, tenant: TenantHandle, path: str = "/v1/completions", **body: object
) -> httpx.Response:
    return client.post(
        path, json={"model": BASE_MODEL, "prompt": "hello world", **body}, headers=tenant.headers
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
        oai.completions.create(model=BASE_MODEL, prompt="hello", logit_bias={"5": 1.0})
    bad_key = openai.OpenAI(
        api_key="lh_wrong", base_url="http://testserver/v1", http_client=client, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        bad_key.completions.create(model=BASE_MODEL, prompt="hello")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("best_of", 3),
        ("logprobs", 2),
        ("echo", True),
        ("suffix", "x"),
        ("logit_bias", {"1": 2}),
        ("presence_penalty", 0.5),
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


def test_chat_response_format_json_is_refused(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    response = client.post(
        "/v1/chat/completions",
        headers=tenant.headers,
        json={
            "model": BASE_MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"},
        },
    )
    assert response.status_code == 400 and "response_format" in response.json()["error"]["message"]


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


def test_no_live_worker_is_a_503_with_retry_after_and_metered_rejected(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    response = complete(client, tenant)
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert "no live worker serves it" in response.json()["error"]["message"]
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("rejected", 0, 0)


def test_unreachable_worker_is_retried_once_on_another(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    down = workers.add("a-down", is_down=True)  # least loaded: chosen first
    draining = workers.add("b-draining", status_code=503, error_type="draining", num_running=1)
    healthy = workers.add("c-healthy", num_running=2)
    response = complete(client, tenant)
    assert response.status_code == 503  # two attempts: a-down then b-draining
    assert len(draining.requests) == 1 and healthy.requests == []
    draining.status_code = 200
    down.is_down = False
    down.status_code, down.error_type = 503, "overloaded"
    assert complete(client, tenant).status_code == 200  # a-down refuses, b-draining serves
    assert [r.status for r in usage_rows(db_session, tenant.id)] == ["rejected", "ok"]
    assert usage_rows(db_session, tenant.id)[1].worker_id == "b-draining"


def test_worker_bad_request_before_streaming_maps_to_400_metered_error(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    workers.add("w1", status_code=400, error_type="bad_request")
    response = complete(client, tenant)
    assert response.status_code == 400 and "bad_request" in response.json()["error"]["message"]
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens, row.worker_id) == ("error", 0, "w1")


def test_worker_error_mid_stream_bills_what_was_delivered_once(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    events = [delta("a", 1), delta("b", 2), {"type": "error", "code": "internal", "message": "engine died"}]
    workers.add("w1", events=events)
    with client.stream(
        "POST",
        "/v1/completions",
        headers=tenant.headers,
        json={"model": BASE_MODEL, "prompt": "hi", "stream": True},
    ) as response:
        chunks = sse_events(response.read().decode())
    assert [c["choices"][0]["text"] for c in chunks[:2]] == ["a", "b"]
    assert "engine died" in chunks[2]["error"]["message"] and chunks[-1] == "[DONE]"
    non_stream = complete(client, tenant)
    assert non_stream.status_code == 502
    rows = usage_rows(db_session, tenant.id)
    assert [(r.status, r.completion_tokens) for r in rows] == [("error", 2), ("error", 0)]
    assert rows[0].prompt_tokens > 0 and "engine died" in rows[0].error_message


def test_stream_without_final_event_is_an_error(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    workers.add("w1", events=[delta("a", 1)])
    assert complete(client, tenant).status_code == 502
    assert [r.status for r in usage_rows(db_session, tenant.id)] == ["error"]


def test_version_pinning_sends_that_versions_key_and_meters_it(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    worker = workers.add("w1")
    v1 = add_ready_version(db_session, tenant.id, "summarize")
    v2 = add_ready_version(db_session, tenant.id, "summarize")
    for model in ("summarize@1", "summarize@2", "summarize"):
        assert complete(client, tenant, model=model).json()["model"] == model
    assert [r.adapter.adapter_key for r in worker.requests] == [v1.id, v2.id, v2.id]
    assert worker.requests[0].adapter.weights_blob_key == v1.weights_blob_key
    rows = usage_rows(db_session, tenant.id)
    assert [r.adapter_version_id for r in rows] == [v1.id, v2.id, v2.id]
    assert {r.model_name for r in rows} == {"summarize"}
    assert complete(client, tenant, model="summarize@3").status_code == 404


def test_adapter_ref_carries_both_file_digests_of_the_version(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    worker = workers.add("w1")
    version = add_ready_version(db_session, tenant.id, "digests")
    version.config_sha256 = "c" * 64
    db_session.commit()
    add_ready_version(db_session, tenant.id, "legacy")  # a row from before migration 0002: no config digest
    assert complete(client, tenant, model="digests").status_code == 200
    assert complete(client, tenant, model="legacy").status_code == 200
    sent, legacy = (r.adapter for r in worker.requests)
    assert (sent.sha256, sent.config_sha256) == (version.sha256, "c" * 64)
    assert legacy.config_sha256 is None  # the worker caches it under its version id alone


def test_routes_to_the_worker_holding_the_adapter(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    version = add_ready_version(db_session, tenant.id, "tuned")
    idle = workers.add("idle")
    warm = workers.add("warm", num_running=3, device_adapters=(version.id,))
    assert complete(client, tenant, model="tuned").status_code == 200
    assert len(warm.requests) == 1 and idle.requests == []
    assert complete(client, tenant).status_code == 200  # base model: least loaded
    assert len(idle.requests) == 1


def test_other_tenants_private_adapter_is_404_and_public_ones_are_usable(
    client: TestClient,
    workers: ScriptedWorkers,
    new_tenant: Callable[[str], TenantHandle],
    db_session: Session,
) -> None:
    worker = workers.add("w1")
    owner, other = new_tenant("owner"), new_tenant("other")
    add_ready_version(db_session, owner.id, "secret")
    shared = add_ready_version(db_session, owner.id, "shared", visibility="public")
    response = complete(client, other, model="secret")
    assert response.status_code == 404 and "not found" in response.json()["error"]["message"]
    assert complete(client, other, model="shared").status_code == 200
    assert worker.requests[-1].adapter.adapter_key == shared.id
    assert worker.requests[-1].adapter.owner_id == owner.id  # workers scope cached files to the owner
    rows = usage_rows(db_session, other.id)
    assert [(r.status, r.adapter_version_id) for r in rows] == [("rejected", None), ("ok", shared.id)]
    assert usage_rows(db_session, owner.id) == []  # the caller pays, not the adapter's owner


def test_adapter_path_alias(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    worker = workers.add("w1")
    v1 = add_ready_version(db_session, tenant.id, "alias")
    add_ready_version(db_session, tenant.id, "alias")
    response = client.post(
        "/v1/adapters/alias/completions", json={"prompt": "hi", "model": "alias@1"}, headers=tenant.headers
    )
    assert response.status_code == 200, response.text
    assert worker.requests[-1].adapter.adapter_key == v1.id
    mismatch = client.post(
        "/v1/adapters/alias/completions", json={"prompt": "hi", "model": "other"}, headers=tenant.headers
    )
    assert mismatch.status_code == 400


def test_unauthenticated_requests_are_not_metered(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
) -> None:
    response = client.post("/v1/completions", json={"model": BASE_MODEL, "prompt": "x"})
    assert response.status_code == 401
    assert usage_rows(db_session, tenant.id) == []


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
    assert client.post(path, json=body | {"min_tokens": 0}, headers=tenant.headers).is_success
    assert [r.sampling.ignore_eos for r in worker.requests] == [True, False]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"min_tokens": 2}, "only supported with ignore_eos=true"),
        ({"min_tokens": 2, "ignore_eos": True, "stop": ["x"]}, "no stop strings"),
        ({"min_tokens": 5, "ignore_eos": True}, "above max_tokens=3"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"ignore_eos": "sometimes"}, "ignore_eos"),
    ],
)
def test_min_tokens_the_engine_cannot_guarantee_is_a_400_saying_why(
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
