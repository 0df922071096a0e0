"""A request's output constraint (structured outputs, issue 37 item 3), torch-free: what it must match, not how.

The grammar library (llguidance) turns it into token masks: registry/grammars.py compiles it (the API checks
it there before anything is queued; the worker compiles it again against its own tokenizer, from the same
cache), gpu_workers/engine/structured_rows.py masks each constrained row of a step.

  json_object   any JSON object (OpenAI's response_format {"type": "json_object"}); spec ""
  json_schema   a JSON schema, spec = its JSON text (response_format json_schema, vLLM's guided_json)
  regex         spec = the regular expression the whole output matches (vLLM's guided_regex)
  choice        spec = a JSON list of strings; the output is exactly one of them (vLLM's guided_choice)
  grammar       spec = a Lark grammar (llguidance's dialect; vLLM's guided_grammar)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, get_args

StructuredKind = Literal["json_object", "json_schema", "regex", "choice", "grammar"]
STRUCTURED_KINDS: tuple[str, ...] = get_args(StructuredKind)
MAX_SPEC_CHARS = 200_000  # a schema larger than this is refused (compile time and memory grow with it)


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must match (module doc); validated at construction (ValueError says what to
    change). `key` is the canonical text the compiled grammar is cached under."""

    kind: StructuredKind
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise ValueError(
                f"structured output kind must be one of {', '.join(STRUCTURED_KINDS)}, got {self.kind!r}"
            )
        if len(self.spec) > MAX_SPEC_CHARS:
            raise ValueError(f"the {self.kind} is {len(self.spec)} characters; the limit is {MAX_SPEC_CHARS}")
        if self.kind == "json_schema":
            _schema_object(self.spec)
        elif self.kind == "choice":
            _choices(self.spec)
        elif self.kind in ("regex", "grammar") and not self.spec:
            raise ValueError(f"the {self.kind} is empty")

    @classmethod
    def json_schema(cls, schema: object) -> StructuredOutput:
        """A json_schema constraint from a parsed schema (its canonical JSON text)."""
        return cls("json_schema", canonical_json(schema))

    @classmethod
    def choice(cls, choices: list[str]) -> StructuredOutput:
        """A choice constraint: the output is exactly one of `choices`."""
        return cls("choice", json.dumps(list(choices), separators=(",", ":")))

    @property
    def key(self) -> str:
        """The canonical text of this constraint (the grammar cache's key, with the tokenizer's)."""
        return f"{self.kind}:{self.spec}"

    @property
    def choices(self) -> list[str]:
        """The allowed outputs of a choice constraint."""
        return _choices(self.spec)


def canonical_json(value: object) -> str:
    """JSON text without spaces: a schema sent twice, however formatted, gets one cache key. Keys keep their
    order: a schema's property order is the order the output writes them in (as OpenAI's does)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _schema_object(spec: str) -> dict[str, object]:
    try:
        schema = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")  # noqa: TRY004 (a 400)
    return schema


def _choices(spec: str) -> list[str]:
    try:
        choices = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise ValueError(f"choice must be a JSON list of strings: {exc}") from exc
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("choice must be a non-empty list of non-empty strings")
    return choices
