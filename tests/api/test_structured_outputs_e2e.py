"""Structured outputs and tool calls end to end (issue 37 items 3, 4): the API over real HTTP, a real worker
process with the tiny model, an adapter uploaded through the API, the official `openai` client."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.api.test_completions_e2e import Stack, stack  # noqa: F401 (the module's running API + worker)

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["good", "bad"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["label", "score"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string", "maxLength": 8}},
            "required": ["q"],
        },
    },
}


def test_json_schema_answers_and_tool_calls_from_an_adapter(
    stack: Stack,  # noqa: F811 (the fixture imported above)
    adapter_dirs: dict[str, Path],
) -> None:
    key = stack.tenant("e2e-structured")
    stack.upload(key, "extractor", adapter_dirs["adapter-01"])
    client = stack.openai(key)
    response_format = {"type": "json_schema", "json_schema": {"name": "r", "strict": True, "schema": SCHEMA}}
    for seed in range(5):
        answer = client.chat.completions.create(
            model="extractor", messages=[{"role": "user", "content": "rate it"}], max_tokens=40, seed=seed,
            extra_body={"response_format": response_format},
        )  # fmt: skip
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SCHEMA)
    called = client.chat.completions.create(
        model="extractor", messages=[{"role": "user", "content": "look it up"}], max_tokens=40, seed=1,
        extra_body={"tools": [TOOL], "tool_choice": "required"},
    )  # fmt: skip
    [call] = called.choices[0].message.tool_calls or []
    assert called.choices[0].finish_reason == "tool_calls" and call.function.name == "lookup"  # type: ignore[union-attr]
    assert set(json.loads(call.function.arguments)) == {"q"}  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError, match="look-around"):
        client.chat.completions.create(
            model="extractor", messages=[{"role": "user", "content": "x"}],
            extra_body={"guided_regex": "(?<=a)b"},
        )  # fmt: skip
