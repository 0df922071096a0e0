"""Structured outputs in the native engine (issue 37 item 3): every sampled output of a constrained row matches its
grammar, unconstrained rows of the same batch are untouched, matchers are freed and replayed."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from gpu_workers.engine.llm_engine import LLMEngine
from registry.grammars import GrammarError
from scheduler.core.sampling import SamplingParams
from scheduler.core.structured_output import StructuredOutput

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "ok": {"type": "boolean"},
    },
    "required": ["label", "score", "tags", "ok"],
    "additionalProperties": False,
}
NUM_SAMPLES = 50


@pytest.fixture(scope="module")
def engine(make_engine: Callable[..., LLMEngine]) -> LLMEngine:
    """An engine of its own (the tests leave matchers and cache counters behind)."""
    return make_engine()


def test_sampled_json_schema_outputs_parse_and_validate(
    engine: LLMEngine, adapter_dirs: dict[str, Path]
) -> None:
    structured = StructuredOutput.json_schema(SCHEMA)
    params = [
        SamplingParams(max_tokens=120, temperature=1.0, seed=i, structured_output=structured)
        for i in range(NUM_SAMPLES)
    ]
    names = sorted(adapter_dirs)
    adapters = [names[i % len(names)] if i % 3 else None for i in range(NUM_SAMPLES)]
    outputs = engine.generate(["the river"] * NUM_SAMPLES, params, adapters)
    for out in outputs:
        assert out.finish_reason == "stop", out.text
        value = json.loads(out.text)
        jsonschema.validate(value, SCHEMA)
        assert list(value) == list(SCHEMA["properties"])  # written in the schema's order
    assert engine.runner.structured.num_live == 0  # finished requests freed their matchers


def test_regex_and_choice_constrain_every_sample(engine: LLMEngine) -> None:
    regex = StructuredOutput("regex", r"[a-c]{2}-[0-9]{3}")
    choice = StructuredOutput.choice(["yes", "no", "maybe later"])
    params = [SamplingParams(max_tokens=40, temperature=1.0, seed=i, structured_output=s)
              for i in range(10) for s in (regex, choice)]  # fmt: skip
    outputs = engine.generate(["one two three"] * len(params), params)
    for p, out in zip(params, outputs):
        if p.structured_output is regex:
            assert re.fullmatch(r"[a-c]{2}-[0-9]{3}", out.text), out.text
        else:
            assert out.text in ("yes", "no", "maybe later")
        assert out.finish_reason == "stop"


def test_unconstrained_rows_are_identical_alone_and_beside_constrained_ones(engine: LLMEngine) -> None:
    plain = [SamplingParams(max_tokens=12, temperature=1.0, seed=100 + i) for i in range(3)]
    alone = engine.generate(["hello world the river"] * 3, plain)
    constrained = [
        SamplingParams(
            max_tokens=60, temperature=1.0, seed=i, structured_output=StructuredOutput("json_object")
        )
        for i in range(3)
    ]
    mixed = engine.generate(["hello world the river"] * 6, plain + constrained)
    assert [o.token_ids for o in mixed[:3]] == [o.token_ids for o in alone]


def test_second_compile_of_a_schema_is_a_cache_hit(engine: LLMEngine) -> None:
    cache = engine.runner.structured.cache
    structured = StructuredOutput.json_schema({"type": "object", "properties": {"n": {"type": "integer"}}})
    engine.runner.structured.check(structured)
    hits, misses = cache.num_hits, cache.num_misses
    same = StructuredOutput("json_schema", '{"type": "object",\n "properties": {"n": {"type": "integer"}}}')
    engine.runner.structured.check(StructuredOutput.json_schema(json.loads(same.spec)))  # sent reformatted
    assert (cache.num_hits, cache.num_misses) == (hits + 1, misses)


def test_a_bad_schema_is_refused_when_added(engine: LLMEngine) -> None:
    bad = StructuredOutput.json_schema({"type": "string", "pattern": "(?<=a)b"})
    request = engine.make_request("bad-schema", "one two", SamplingParams(structured_output=bad))
    with pytest.raises(GrammarError, match="look-around"):
        engine.add_request(request)
    assert engine.scheduler.get("bad-schema") is None


def test_a_matcher_replays_the_outputs_it_has_not_seen(engine: LLMEngine) -> None:
    """A request whose matcher is dropped mid-generation (as after a recompute) still ends with valid output."""
    structured = StructuredOutput.json_schema(SCHEMA)
    engine.add_request(engine.make_request("replay", "the river", SamplingParams(
        max_tokens=120, temperature=1.0, seed=7, structured_output=structured)))  # fmt: skip
    seq = engine.scheduler.get("replay")
    assert seq is not None
    while seq.num_output_tokens < 4:
        engine.step()
    engine.runner.structured.release("replay")  # as if its state were lost
    while not seq.is_finished:
        engine.step()
    jsonschema.validate(json.loads(seq.output_text), SCHEMA)


def test_structured_output_with_ignore_eos_is_refused() -> None:
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(ignore_eos=True, structured_output=StructuredOutput("json_object"))


@pytest.mark.parametrize("rows", [[0, 2, 3], [0, 1, 2, 3]])
def test_masks_leave_exactly_the_allowed_tokens_of_the_masked_rows(rows: list[int]) -> None:
    import torch

    from gpu_workers.engine.structured_rows import StepMasks, _allow, apply_masks

    vocab = 100  # not a multiple of 32: the last word's high bits are past the vocabulary
    allowed = [(0, 31, 32, 99), (5,), (63, 64), (1, 2)][: len(rows)]
    bitmask = torch.zeros((len(rows), 4), dtype=torch.int32)
    for k, tokens in enumerate(allowed):
        _allow(bitmask[k], tokens)
    logits = torch.randn(4, vocab)
    masked = logits.clone()
    apply_masks(masked, StepMasks(rows, bitmask))
    for k, row in enumerate(rows):
        assert torch.isfinite(masked[row]).nonzero().flatten().tolist() == list(allowed[k])
    for row in set(range(4)) - set(rows):
        assert torch.equal(masked[row], logits[row])


def test_preempted_constrained_requests_give_the_same_valid_outputs(
    make_engine: Callable[..., LLMEngine], engine: LLMEngine
) -> None:
    """A full KV budget preempts and recomputes sequences; their matchers resume where they were (same seeded
    tokens as an engine that never preempts, every output valid)."""
    small = make_engine(num_kv_blocks=20, block_size=4, memory_mode="static")  # one sequence fits, not 4
    structured = StructuredOutput.json_schema(SCHEMA)
    params = [
        SamplingParams(max_tokens=60, temperature=1.0, seed=i, structured_output=structured) for i in range(4)
    ]
    got = small.generate(["the river"] * 4, params)
    expected = engine.generate(["the river"] * 4, params)
    assert small.engine_stats().num_preemptions > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    for out in got:
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_a_row_whose_outputs_broke_its_grammar_may_only_end(engine: LLMEngine) -> None:
    from scheduler.core.sequence import Sequence

    rows = engine.runner.structured
    params = SamplingParams(structured_output=StructuredOutput.choice(["yes", "no"]))
    seq = Sequence("broken", [1, 2, 3], params, None, max_tokens=8)
    seq.token_ids.append(rows.tokenizer.ll.tokenize_str("maybe")[0])  # not a prefix of yes/no
    masks = rows.masks([(0, seq)])
    allowed = [t for t in range(rows.vocab_size) if masks.bitmask[0, t // 32] >> (t % 32) & 1]
    assert allowed == sorted(rows.tokenizer.eos_token_ids)
    rows.release("broken")
