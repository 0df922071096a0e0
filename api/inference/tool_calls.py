"""Tool calls, response side (issue 37 item 4): a chat completion's text parsed into OpenAI's `tool_calls`.

Non-streamed: message {"role": "assistant", "content": null, "tool_calls": [{"id", "type": "function",
"function": {"name", "arguments": <JSON text>}}]} with finish_reason "tool_calls". Streamed: a chunk whose
delta.tool_calls holds each call whole (index, id, type, function name and arguments) before the finishing
chunk; the text that might be a call is held back until it is known to be one or not (a constrained call:
all of it; "auto": while it still looks like the start of one), and is sent as content when it is not.
The formats read are those api/inference/tools.py asks for or its module doc lists.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from api.inference.tools import ToolPlan

TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TOOL_CALL_OPEN = "<tool_call>"


def parse_tool_calls(text: str, plan: ToolPlan) -> list[dict[str, Any]] | None:
    """OpenAI tool_calls from the output text; None when it is not (only) calls of the plan's functions."""
    stripped = text.strip()
    blocks = TOOL_CALL_BLOCK.findall(stripped)
    if blocks and not TOOL_CALL_BLOCK.sub("", stripped).strip():
        candidates: list[Any] = [_loads(b) for b in blocks]
    else:
        value = _loads(stripped)
        candidates = value if isinstance(value, list) else [value]
    calls = [_call(c, plan) for c in candidates]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _call(value: Any, plan: ToolPlan) -> dict[str, Any] | None:
    """One call from {"name", "arguments"} (or Llama's "parameters") naming a function of the plan."""
    if not isinstance(value, dict) or value.get("name") not in plan.names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": value["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def could_start_a_call(text: str) -> bool:
    """True while `text` may still be the beginning of a tool call in a format that is read."""
    head = text.lstrip()
    return head == "" or head[0] in "{[" or head.startswith(TOOL_CALL_OPEN) or TOOL_CALL_OPEN.startswith(head)


class ToolCallStream:
    """Holds back streamed text that may be a tool call (module doc). `feed` returns the text to send now as
    content; `finish` returns (content still to send, tool calls or None)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.held = ""
        self.is_content = False  # once the text is known not to be a call, it streams through

    def feed(self, text: str) -> str:
        """Text to send now (empty while it is held back)."""
        if self.is_content:
            return text
        self.held += text
        if self.plan.is_constrained or could_start_a_call(self.held):
            return ""
        self.is_content, held, self.held = True, self.held, ""
        return held

    def finish(self) -> tuple[str, list[dict[str, Any]] | None]:
        """The held text parsed: ("", calls) when it is calls, else (the held text, None)."""
        held, self.held = self.held, ""
        calls = parse_tool_calls(held, self.plan) if held and not self.is_content else None
        return ("", calls) if calls else (held, None)


def streamed_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """delta.tool_calls of one chunk carrying each call whole, with its index."""
    return [{"index": i, **call} for i, call in enumerate(calls)]
