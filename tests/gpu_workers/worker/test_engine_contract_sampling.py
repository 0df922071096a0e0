"""The engine contract's sampling features, run on both engines behind a real worker (the fixtures and the
skip rule of tests/gpu_workers/worker/test_engine_contract.py): each token's logprob and top alternatives equal
transformers + peft's log_softmax for the base model and an adapter (the prompt's too); penalties give the greedy tokens of the
reference (transformers' repetition penalty, OpenAI's frequency / presence formula) and logit_bias with
min_tokens holds a stop token back exactly min_tokens tokens; a plain greedy row beside them is unchanged; the
final event's cumulative logprob (best_of's ranking) is the sum of the tokens' logprobs, shown or not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from tests.gpu_workers.conftest import HfOracle
from tests.gpu_workers.worker.test_engine_contract import (
    PROMPTS,
    SERVED,
    _body,
    _run,
    _tokens,
    contract_model,
    engine_worker,
)

__all__ = ["contract_model", "engine_worker"]  # the contract suite's fixtures, used here

pytestmark = pytest.mark.slow  # starts worker processes

NUM_TOKENS = 6
NUM_TOP = 3
PENALTIES = {"repetition_penalty": 1.5, "frequency_penalty": 0.7, "presence_penalty": 0.4}


@pytest.fixture(scope="module")
def oracle(contract_model: Path) -> HfOracle:
    adapters = {name: contract_model / "adapters" / name for name in SERVED}
    return HfOracle(contract_model / "base", adapters, torch.float32)


def penalised_greedy(oracle: HfOracle, prompt: list[int], adapter: str | None, num_tokens: int) -> list[int]:
    """Greedy tokens under PENALTIES by the reference formulas."""
    ids = list(prompt)
    for _ in range(num_tokens):
        logits = oracle.logits(ids, adapter)
        logits = RepetitionPenaltyLogitsProcessor(PENALTIES["repetition_penalty"])(
            torch.tensor([ids]), logits[None]
        )[0]
        output = ids[len(prompt) :]
        for token in set(output):
            logits[token] -= (
                PENALTIES["frequency_penalty"] * output.count(token) + PENALTIES["presence_penalty"]
            )
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("adapter", [None, "adapter-01"])
def test_logprobs_equal_transformers_and_peft(engine_worker, oracle: HfOracle, adapter: str | None) -> None:  # type: ignore[no-untyped-def]
    ref = engine_worker.extra["refs"][adapter] if adapter else None
    body = _body(f"logprobs-{adapter}", PROMPTS[0], ref, NUM_TOKENS, logprobs=NUM_TOP)
    [(status, events, error)] = _run(engine_worker, [body])
    assert status == 200, error
    logprobs = [lp for e in events if e.type == "delta" for lp in e.logprobs or []]
    tokens = _tokens(events)
    assert len(logprobs) == len(tokens) == NUM_TOKENS
    ids = list(PROMPTS[0])
    for token, lp in zip(tokens, logprobs):
        expected = torch.log_softmax(oracle.logits(ids, adapter), dim=-1)
        assert lp.token_id == token and lp.logprob == pytest.approx(float(expected[token]), abs=1e-3)
        top_values, top_ids = expected.topk(NUM_TOP)
        assert [t for t, _ in lp.top] == top_ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top_values.tolist(), abs=1e-3)
        ids.append(token)


def test_penalties_bias_and_min_tokens_per_row_of_one_batch(engine_worker, oracle: HfOracle) -> None:  # type: ignore[no-untyped-def]
    ref = engine_worker.extra["refs"]["adapter-00"]
    stop = 5
    bodies = [
        _body("plain", PROMPTS[1], None, NUM_TOKENS),
        _body("penalised", PROMPTS[1], ref, NUM_TOKENS, **PENALTIES),
        _body(
            "held",
            PROMPTS[2],
            None,
            NUM_TOKENS,
            logit_bias={stop: 100.0},
            stop_token_ids=[stop],
            min_tokens=3,
        ),
    ]
    plain, penalised, held = _run(engine_worker, bodies)
    assert _tokens(plain[1]) == oracle.greedy(PROMPTS[1], None, NUM_TOKENS)
    assert _tokens(penalised[1]) == penalised_greedy(oracle, PROMPTS[1], "adapter-00", NUM_TOKENS)
    held_tokens = _tokens(held[1])
    assert len(held_tokens) == 4 and held_tokens[-1] == stop and stop not in held_tokens[:3]
    assert held[1][-1].finish_reason == "stop"


def test_prompt_logprobs_equal_transformers_and_peft(engine_worker, oracle: HfOracle) -> None:  # type: ignore[no-untyped-def]
    ref = engine_worker.extra["refs"]["adapter-02"]
    prompt = PROMPTS[2]
    body = _body("prompt-logprobs", prompt, ref, 2, prompt_logprobs=NUM_TOP)
    [(status, events, error)] = _run(engine_worker, [body])
    assert status == 200, error
    [got] = [e.prompt_logprobs for e in events if e.type == "delta" and e.prompt_logprobs is not None]
    assert len(got) == len(prompt) and got[0] is None
    for position, lp in enumerate(got[1:]):
        expected = torch.log_softmax(oracle.logits(prompt[: position + 1], "adapter-02"), dim=-1)
        assert lp is not None and lp.token_id == prompt[position + 1]
        assert lp.logprob == pytest.approx(float(expected[lp.token_id]), abs=1e-3)
        assert [t for t, _ in lp.top] == expected.topk(NUM_TOP).indices.tolist()


def test_final_cumulative_logprob_is_the_sum_of_the_tokens_logprobs_shown_or_not(  # type: ignore[no-untyped-def]
    engine_worker, oracle: HfOracle
) -> None:
    ref = engine_worker.extra["refs"]["adapter-01"]
    bodies = [
        _body("summed-shown", PROMPTS[0], ref, NUM_TOKENS, logprobs=0, needs_cumulative_logprob=True),
        _body("summed-only", PROMPTS[0], ref, NUM_TOKENS, needs_cumulative_logprob=True),
        _body("shown-only", PROMPTS[0], ref, NUM_TOKENS, logprobs=0),
    ]
    results = _run(engine_worker, bodies)
    assert [status for status, _, _ in results] == [200] * 3, results
    (_, shown, _), (_, summed, _), (_, plain, _) = results
    logprobs = [lp.logprob for e in shown if e.type == "delta" for lp in e.logprobs or []]
    assert len(logprobs) == NUM_TOKENS
    assert shown[-1].cumulative_logprob == pytest.approx(sum(logprobs), abs=1e-4)
    # without logprobs asked: none shown, the same sum (the same greedy tokens of the same adapter)
    assert _tokens(summed) == _tokens(shown) and all(e.logprobs is None for e in summed)
    assert summed[-1].cumulative_logprob == pytest.approx(sum(logprobs), abs=1e-4)
    assert plain[-1].type == "final" and plain[-1].cumulative_logprob is None
    ids = list(PROMPTS[0])
    expected = 0.0
    for token in _tokens(shown):
        expected += float(torch.log_softmax(oracle.logits(ids, "adapter-01"), dim=-1)[token])
        ids.append(token)
    assert summed[-1].cumulative_logprob == pytest.approx(expected, abs=1e-3 * NUM_TOKENS)
