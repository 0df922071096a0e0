"""Structured outputs, request side (issue 37 item 3): the request's constraint read from OpenAI's
`response_format` or vLLM's extra fields, and compiled against the base model's tokenizer before anything is
queued (a constraint llguidance refuses is a 400 naming the problem; registry/grammars.py).

Accepted, at most one per request:
  response_format {"type": "json_object"}                                   any JSON object
  response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}
  structured_outputs {"json": schema} | {"regex": ...} | {"choice": [...]} | {"grammar": lark} |
                     {"json_object": true}                                  vLLM >= 0.10.2's names
  guided_json, guided_regex, guided_choice, guided_grammar                  vLLM's classic names (removed in
                                                                            its 0.12; kept here for old clients)
`strict` is accepted either way: the output always matches the schema (additional properties are allowed only
where the schema allows them, as JSON Schema says). A tool call with tool_choice "required" or a named function
brings its own constraint (api/inference/tools.py) and cannot be combined with another.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from api.errors import ApiError
from api.inference.tools import ToolPlan
from api.prompting import BaseModelTokenizer
from registry.grammars import GrammarCache, GrammarError, GrammarTokenizer, grammar_tokenizer
from scheduler.core.structured_output import StructuredOutput

VLLM_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
GUIDED_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def structured_output_of(body: Any) -> StructuredOutput | None:
    """The request's output constraint (None: free text); ApiError 400 saying what to change."""
    found: list[tuple[str, StructuredOutput]] = []
    response_format = getattr(body, "response_format", None)
    if response_format is not None:
        structured = _from_response_format(response_format)
        if structured is not None:
            found.append(("response_format", structured))
    for field, key in GUIDED_FIELDS.items():
        value = getattr(body, field, None)
        if value is not None:
            found.append((field, _constraint(field, key, value)))
    vllm = getattr(body, "structured_outputs", None)
    if vllm is not None:
        found.append(("structured_outputs", _from_structured_outputs(vllm)))
    if len(found) > 1:
        raise _bad(f"send one output constraint, not {' and '.join(name for name, _ in found)}")
    return found[0][1] if found else None


def _from_response_format(value: Any) -> StructuredOutput | None:
    if not isinstance(value, dict):
        raise _bad("response_format must be an object with a `type`")
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise _bad('response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}')
        return _constraint("response_format.json_schema.schema", "json", spec.get("schema") or {})
    raise _bad(f"response_format type {kind!r} is not supported; use text, json_object or json_schema")


def _from_structured_outputs(value: Any) -> StructuredOutput:
    if not isinstance(value, dict):
        raise _bad('structured_outputs must be an object such as {"json": {...}}')
    given = {k: v for k, v in value.items() if v not in (None, False)}
    if given == {"json_object": True}:
        return StructuredOutput("json_object")
    unknown = sorted(set(given) - set(VLLM_KEYS))
    if unknown or len(given) != 1:
        raise _bad(
            f"structured_outputs takes exactly one of {', '.join(VLLM_KEYS)} or json_object; got {sorted(given)}"
        )
    key, spec = next(iter(given.items()))
    return _constraint(f"structured_outputs.{key}", key, spec)


def _constraint(field: str, key: str, value: Any) -> StructuredOutput:
    """One constraint from vLLM's key (json / regex / choice / grammar) and the request's value."""
    try:
        if key == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            if not isinstance(schema, dict):
                raise TypeError("a JSON schema must be an object")
            return StructuredOutput.json_schema(schema)
        if key == "choice":
            if not isinstance(value, list):
                raise TypeError("choice must be a list of strings")
            return StructuredOutput.choice(value)
        if not isinstance(value, str):
            raise TypeError(f"{key} must be a string")
        return StructuredOutput(VLLM_KEYS[key], value)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise _bad(f"{field}: {exc}") from exc


def request_constraint(body: Any, tools: ToolPlan | None) -> StructuredOutput | None:
    """The constraint the engine applies: the request's own, or a constrained tool call's (never both)."""
    structured = structured_output_of(body)
    tool_constraint = tools.constraint() if tools is not None else None
    if structured is not None and tool_constraint is not None:
        raise _bad(
            f"tool_choice {tools.choice!r} constrains the output to a tool call; drop the output "  # type: ignore[union-attr]
            'constraint (response_format / guided_* / structured_outputs) or use tool_choice "auto"'
        )
    structured = structured or tool_constraint
    if structured is not None and getattr(body, "ignore_eos", False):
        raise _bad(
            "ignore_eos cannot be combined with structured output or a required tool call; drop ignore_eos"
        )
    return structured


class StructuredChecker:
    """Compiles constraints against each base model's tokenizer, with one grammar cache for the API process
    (a schema sent again is not compiled again). Thread-safe; `check` blocks (call it in the threadpool)."""

    def __init__(self, cache: GrammarCache | None = None) -> None:
        self.cache = cache if cache is not None else GrammarCache()
        self._tokenizers: dict[int, tuple[BaseModelTokenizer, GrammarTokenizer]] = {}
        self._lock = threading.Lock()

    def check(self, tokenizer: BaseModelTokenizer, structured: StructuredOutput) -> None:
        """ApiError 400 naming the problem when the grammar library cannot use the constraint."""
        try:
            self.cache.matcher(structured, self._grammar_tokenizer(tokenizer))
        except GrammarError as exc:
            raise _bad(f"{exc}; fix it or send a simpler one") from exc

    def _grammar_tokenizer(self, tokenizer: BaseModelTokenizer) -> GrammarTokenizer:
        with self._lock:
            held = self._tokenizers.get(id(tokenizer))
        if held is not None and held[0] is tokenizer:
            return held[1]
        eos = tokenizer.special_tokens.get("eos_token")
        eos_id = tokenizer.tokenizer.token_to_id(eos) if eos else None
        built = grammar_tokenizer(tokenizer.tokenizer.to_str(), None, [eos_id] if eos_id is not None else [])
        with self._lock:
            if len(self._tokenizers) >= 16:  # a few base models per API process; re-added ones replace theirs
                self._tokenizers.clear()
            self._tokenizers[id(tokenizer)] = (tokenizer, built)
        return built


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)
