"""Structured outputs and tool calls at the API (issue 37 items 3, 4), with scripted workers: the constraint
sent to the worker, refusals before anything is queued, tool calls parsed from the output, streamed and not."""

from __future__ import annotations

import json
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
    delta,
    final,
    sse_events,
    usage_rows,
)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather in a city", "parameters": SCHEMA},
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
CALL_TEXT = '{"name":"get_weather","arguments":{"city":"Oslo"}}'


def chat(client: TestClient, tenant: TenantHandle, **body: Any) -> Any:
    """POST a chat completion of one user message."""
    payload = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    return client.post("/v1/chat/completions", json=payload, headers=tenant.headers)


def text_events(*pieces: str) -> list[dict[str, Any]]:
    """One delta per piece, then a final that stopped."""
    return [delta(p, 10 + i) for i, p in enumerate(pieces)] + [final(0, len(pieces), "stop")]


@pytest.mark.parametrize(
    ("body", "kind", "spec"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object", ""),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "c", "schema": SCHEMA, "strict": True},
                }
            },
            "json_schema",
            json.dumps(SCHEMA, separators=(",", ":")),
        ),
        ({"guided_json": SCHEMA}, "json_schema", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"guided_regex": "[0-9]{3}"}, "regex", "[0-9]{3}"),
        ({"guided_choice": ["yes", "no"]}, "choice", '["yes","no"]'),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", '["yes","no"]'),
        ({"structured_outputs": {"json_object": True}}, "json_object", ""),
    ],
)
def test_output_constraint_reaches_the_worker(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, body: dict, kind: str, spec: str
) -> None:
    worker = workers.add("w1", events=text_events("{}"))
    response = chat(client, tenant, **body)
    assert response.status_code == 200, response.text
    sent = worker.requests[0].sampling.structured_output
    assert sent is not None and (sent.kind, sent.spec) == (kind, spec)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"guided_regex": "[0-9"}, "unclosed character class"),
        ({"guided_json": {"type": "string", "pattern": "(?<=a)b"}}, "look-around"),
        ({"guided_json": {"type": "objekt"}}, "objekt"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
            "json_schema",
        ),
        ({"response_format": {"type": "xml"}}, "xml"),
        ({"guided_choice": []}, "choice"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex and guided_choice"),
        ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos"),
        ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "bad name"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
    ],
)
def test_bad_constraint_is_a_400_naming_it_before_anything_is_queued(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    body: dict,
    named: str,
) -> None:
    worker = workers.add("w1")
    response = chat(client, tenant, **body)
    assert response.status_code == 400, response.text
    assert named in response.json()["error"]["message"]
    assert worker.requests == []
    [row] = usage_rows(db_session, tenant.id)
    assert row.status == "rejected"


def test_a_schema_sent_twice_is_compiled_once(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    workers.add("w1", events=text_events("{}"))
    cache = client.app.state.services.structured.cache  # type: ignore[attr-defined]
    schema = {"type": "object", "properties": {"unique_to_this_test": {"type": "integer"}}}
    assert chat(client, tenant, guided_json=schema).status_code == 200
    hits, misses = cache.num_hits, cache.num_misses
    assert chat(client, tenant, guided_json=json.dumps(schema, indent=2)).status_code == 200
    assert (cache.num_hits, cache.num_misses) == (hits + 1, misses)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_required_or_named_tool_choice_constrains_and_parses_the_call(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, tool_choice: Any
) -> None:
    worker = workers.add("w1", events=text_events('{"name":"get_weather",', '"arguments":{"city":"Oslo"}}'))
    response = chat(client, tenant, tools=[WEATHER, TIME], tool_choice=tool_choice)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    constraint = json.loads(worker.requests[0].sampling.structured_output.spec)
    names = {s["properties"]["name"]["const"] for s in constraint.get("anyOf", [constraint])}
    assert names == ({"get_weather", "get_time"} if tool_choice == "required" else {"get_weather"})


def test_tools_are_described_to_a_template_that_does_not_know_them(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, tokenizer: BaseModelTokenizer
) -> None:
    worker = workers.add("w1", events=text_events("hello"))
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    response = chat(client, tenant, messages=messages, tools=[WEATHER])
    body = response.json()
    assert (
        body["choices"][0]["message"]["content"] == "hello" and body["choices"][0]["finish_reason"] == "stop"
    )
    prompt = tokenizer.tokenizer.decode(worker.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert "get_weather" in prompt and '"arguments"' in prompt and "sunny" in prompt
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in prompt  # the earlier call, as text


def test_auto_tool_choice_parses_a_call_in_the_output_and_leaves_text_alone(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    workers.add("w1", events=text_events("<tool_call>\n", CALL_TEXT, "\n</tool_call>"))
    choice = chat(client, tenant, tools=[WEATHER]).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    workers.add("w1", events=text_events('{"name": "not_a_tool", "arguments": {}}'))
    choice = chat(client, tenant, tools=[WEATHER]).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"].startswith('{"name"')


def test_streamed_tool_call_deltas_reassemble_with_the_openai_client(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    workers.add("w1", events=text_events('{"name":"get_weather",', '"arguments":', '{"city":"Oslo"}}'))
    oai = openai.OpenAI(
        api_key=tenant.key, base_url="http://testserver/v1", http_client=client, max_retries=0
    )
    stream = oai.chat.completions.create(
        model=BASE_MODEL, messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice="required",
        stream=True,
    )  # fmt: skip
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            assert not choice.delta.content
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Oslo"}


def test_streamed_auto_text_that_is_no_call_streams_as_content(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    workers.add("w1", events=text_events("Hello", " there"))
    response = chat(client, tenant, tools=[WEATHER], stream=True)
    chunks = [c for c in sse_events(response.text)[:-1] if c["choices"]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello there"
    assert chunks[0]["choices"][0]["delta"]["content"] == "Hello"  # not held back: it cannot be a call
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
