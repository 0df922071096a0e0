"""Compiled output grammars (structured outputs, issue 37 item 3) with llguidance, torch-free: the API checks a
request's constraint with it before anything is queued, the engine takes a matcher per constrained row from it.

Why llguidance and not xgrammar (benchmarks/grammar_libraries.py, 17 JSON schemas, SmolLM2's 49k-token
vocabulary and the tests' tiny one; results in benchmarks/RESULTS.md): both cover all 17 schemas (nested
objects, arrays with bounds, enum, const, anyOf/oneOf, $ref incl. recursive, pattern, date-time/email/uuid
formats, min/max, string lengths). xgrammar computes a mask ~10x faster once compiled (2.7 vs 28 us per token,
median, SmolLM2) but imports torch (and needs transformers for its tokenizer): the API process, which must
refuse a bad schema before queueing against the base model's tokenizer, has neither. llguidance imports in
50 ms with no torch, builds its tokenizer from tokenizer.json (which the API already holds), compiles lazily
(a schema: ~0.5 ms for a new matcher, 0.01 ms for a copy of a cached one) and its per-row mask (~30 us) is far
below a decode step and is computed while the step's forward pass runs (gpu_workers/engine/structured_rows.py).
One library on both sides: a schema the API accepts is one the engine can run.

`GrammarCache` holds a pristine matcher per (constraint's canonical text, tokenizer key), LRU-bounded; every
request gets a deep copy (its own parser state). Counters say how often a compile was saved.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import llguidance

from scheduler.core.structured_output import StructuredOutput

DEFAULT_MAX_GRAMMARS = 256  # compiled grammars kept per process (a matcher is tens of KB; lexers grow lazily)
# Without flexible whitespace a sampled row cannot spend its tokens on blanks between JSON items (it would
# then run out of max_tokens before closing the object); values are written compactly: {"a":1,"b":[2,3]}.
JSON_OPTIONS: Any = {"whitespace_flexible": False}  # llguidance JsonCompileOptions


class GrammarError(ValueError):
    """A constraint the grammar library refuses; the message names the problem."""


@dataclass(frozen=True)
class GrammarTokenizer:
    """A base model's tokenizer as llguidance reads it; `key` identifies its vocabulary (the cache's key)."""

    key: str
    ll: Any  # llguidance.LLTokenizer
    vocab_size: int
    eos_token_ids: tuple[int, ...]


def grammar_tokenizer(
    tokenizer_json: str, vocab_size: int | None, eos_token_ids: list[int]
) -> GrammarTokenizer:
    """llguidance's tokenizer from tokenizer.json's text; `vocab_size`: the model's logits width (None: the
    tokenizer's); `eos_token_ids`: the tokens that end a sequence (the only ones allowed once complete)."""
    if not eos_token_ids:
        raise GrammarError(
            "the base model's tokenizer names no end-of-sequence token; structured output needs one"
        )
    ll = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))
    digest = hashlib.sha256(tokenizer_json.encode()).hexdigest()[:16]
    key = f"{digest}:{ll.vocab_size}:{','.join(map(str, eos_token_ids))}"
    return GrammarTokenizer(key, ll, int(ll.vocab_size), tuple(eos_token_ids))


def grammar_text(structured: StructuredOutput) -> str:
    """The llguidance grammar of a constraint (not yet checked against a tokenizer)."""
    kind, spec = structured.kind, structured.spec
    try:
        if kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema('{"type":"object"}', overrides=JSON_OPTIONS)
        if kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(spec, overrides=JSON_OPTIONS)
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec)
        if kind == "choice":
            alternatives = " | ".join(json.dumps(c, ensure_ascii=True) for c in structured.choices)
            return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
        return llguidance.LLMatcher.grammar_from_lark(spec)
    except ValueError as exc:
        raise GrammarError(f"the {kind} is not usable: {exc}") from exc


def compile_matcher(structured: StructuredOutput, tokenizer: GrammarTokenizer) -> Any:
    """A fresh llguidance.LLMatcher for the constraint; GrammarError naming the problem when it has one."""
    grammar = grammar_text(structured)
    error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer.ll)
    if error and not error.startswith("WARNING"):
        raise GrammarError(f"the {structured.kind} is not usable: {error}")
    matcher = llguidance.LLMatcher(tokenizer.ll, grammar, log_level=0)
    if matcher.is_error():
        raise GrammarError(f"the {structured.kind} is not usable: {matcher.get_error()}")
    return matcher


class GrammarCache:
    """Compiled grammars per (constraint, tokenizer), least recently used first out beyond `max_grammars`.
    Thread-safe (the API compiles in its threadpool); a compile runs outside the lock."""

    def __init__(self, max_grammars: int = DEFAULT_MAX_GRAMMARS) -> None:
        if max_grammars < 1:
            raise ValueError(f"max_grammars must be >= 1, got {max_grammars}")
        self.max_grammars = max_grammars
        self._matchers: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.num_hits = 0
        self.num_misses = 0

    def matcher(self, structured: StructuredOutput, tokenizer: GrammarTokenizer) -> Any:
        """A matcher of its own for one request (a copy of the cached compiled one); GrammarError if bad."""
        key = (structured.key, tokenizer.key)
        with self._lock:
            pristine = self._matchers.get(key)
            if pristine is not None:
                self._matchers.move_to_end(key)
                self.num_hits += 1
                return pristine.deep_copy()
            self.num_misses += 1
        pristine = compile_matcher(structured, tokenizer)
        with self._lock:
            self._matchers[key] = pristine
            self._matchers.move_to_end(key)
            while len(self._matchers) > self.max_grammars:
                self._matchers.popitem(last=False)
        return pristine.deep_copy()

    def __len__(self) -> int:
        return len(self._matchers)
