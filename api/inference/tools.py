"""Tool calls, request side (issue 37 item 4): `tools` + `tool_choice` checked, rendered into the chat prompt and,
for `required` or a named function, turned into the output constraint that makes the call always parse.

Formats. A base model whose chat template knows tools (its source uses `tools`) gets them through the template
(`tools=` as transformers' apply_chat_template passes them), and the messages keep their `tool_calls` and
`tool_call_id`. A template that does not (SmolLM2's, the tiny test model's) gets one system message that lists
the tools and asks for the generic format, one JSON object per call:

    {"name": "<function name>", "arguments": {<the function's arguments>}}

and earlier assistant tool calls / tool results are rendered as plain text in that format. With
`tool_choice` "required" or a named function the output is constrained by a JSON schema of that shape
(`name` a const of the allowed functions, `arguments` each function's `parameters`), so it always parses
(api/inference/tool_calls.py turns it into `tool_calls`). With "auto" the output is parsed best effort: the
generic object (or a list of them), or `<tool_call>{...}</tool_call>` blocks (Hermes/Qwen templates); anything
else is content. "none" (the default without tools) renders no tools. One call per answer when constrained.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from api.errors import ApiError
from api.prompting import BaseModelTokenizer
from scheduler.core.structured_output import StructuredOutput

MAX_TOOLS = 128
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    """The request's tools and how they may be called: `choice` is "auto", "required" or a function's name."""

    functions: tuple[dict[str, Any], ...]  # OpenAI's function objects: name, description?, parameters?
    choice: str

    @property
    def names(self) -> tuple[str, ...]:
        """The functions' names."""
        return tuple(f["name"] for f in self.functions)

    @property
    def is_constrained(self) -> bool:
        """True when the output must be a call (so it is constrained to one)."""
        return self.choice != "auto"

    def constraint(self) -> StructuredOutput | None:
        """The JSON schema a constrained call's output matches (None for "auto")."""
        if not self.is_constrained:
            return None
        chosen = [f for f in self.functions if self.choice in ("required", f["name"])]
        schemas = [_call_schema(f) for f in chosen]
        return StructuredOutput.json_schema(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": function["name"]},
            "arguments": function.get("parameters") or EMPTY_PARAMETERS,
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_plan(tools: list[Any] | None, tool_choice: Any) -> ToolPlan | None:
    """The request's ToolPlan (None: no tools, or tool_choice "none"); ApiError 400 naming what is wrong."""
    if tool_choice is not None and not tools and tool_choice != "none":
        raise _bad("tool_choice needs tools: send tools or drop tool_choice")
    if not tools:
        return None
    if len(tools) > MAX_TOOLS:
        raise _bad(f"tools holds {len(tools)} tools; the limit is {MAX_TOOLS}")
    functions = tuple(_function(i, tool) for i, tool in enumerate(tools))
    names = [f["name"] for f in functions]
    if len(set(names)) < len(names):
        raise _bad("tools: two functions have the same name; give each its own")
    choice = _choice(tool_choice, names)
    return None if choice == "none" else ToolPlan(functions, choice)


def _function(index: int, tool: Any) -> dict[str, Any]:
    if (
        not isinstance(tool, dict)
        or tool.get("type", "function") != "function"
        or not isinstance(tool.get("function"), dict)
    ):
        raise _bad(
            f'tools[{index}] must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}'
        )
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise _bad(f"tools[{index}].function.name must be 1-64 letters, digits, _ or -, got {name!r}")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _bad(f"tools[{index}].function.parameters must be a JSON schema object")
    description = function.get("description")
    kept = {"name": name, "description": description if isinstance(description, str) else None}
    return kept | {"parameters": parameters or EMPTY_PARAMETERS}


def _choice(tool_choice: Any, names: list[str]) -> str:
    if tool_choice is None:
        return "auto"
    if tool_choice in ("auto", "none", "required"):
        return str(tool_choice)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name in names:
            return str(name)
        raise _bad(f"tool_choice names function {name!r}, which is not in tools ({', '.join(names)})")
    raise _bad(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}'
    )


def chat_inputs(
    tokenizer: BaseModelTokenizer, messages: list[dict[str, Any]], plan: ToolPlan | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and `tools` to render: through the template when it knows tools, else as a system message
    and plain-text calls (module doc)."""
    if plan is None and not _has_tool_messages(messages):
        return messages, None
    if "tools" in tokenizer.chat_template:
        tools = [{"type": "function", "function": f} for f in plan.functions] if plan else None
        return messages, tools
    plain = [_as_plain(m) for m in messages]
    if plan is None:
        return plain, None
    return _with_tool_prompt(plain, plan), None


def _has_tool_messages(messages: list[dict[str, Any]]) -> bool:
    return any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages)


def _as_plain(message: Any) -> Any:
    """An assistant's tool calls as generic-format text; other messages unchanged."""
    if not isinstance(message, dict) or not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            pass
        calls.append(json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False))
    content = message.get("content") or ""
    return {"role": message.get("role"), "content": "\n".join([content, *calls] if content else calls)}


def _with_tool_prompt(messages: list[Any], plan: ToolPlan) -> list[Any]:
    listing = "\n".join(
        json.dumps({k: v for k, v in f.items() if v is not None}, ensure_ascii=False) for f in plan.functions
    )
    must = {"auto": "When a tool helps, call it", "required": "Call one of them"}.get(
        plan.choice, f"Call {plan.choice}"
    )
    prompt = (
        f"You can call these tools (each with a JSON schema of its arguments):\n{listing}\n{must}: answer with only "
        'a JSON object {"name": <the tool\'s name>, "arguments": <its arguments as a JSON object>}.'
    )
    first = messages[0] if messages else None
    if (
        isinstance(first, dict)
        and first.get("role") in ("system", "developer")
        and isinstance(first.get("content"), str)
    ):
        return [{"role": first["role"], "content": f"{first['content']}\n\n{prompt}"}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)
