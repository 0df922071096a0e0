"""Logits processors on fixed logits against reference implementations: transformers' repetition penalty,
OpenAI's documented frequency / presence formula, logit_bias as an addition, min_tokens as a mask; each row
gets what it would get alone, and rows that ask for nothing are untouched."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from gpu_workers.engine.layers.logits_processors import RowHistory, apply_logits_processors
from gpu_workers.engine.layers.logprobs import token_logprobs
from gpu_workers.engine.layers.sampler import sample
from scheduler.core.sampling import SamplingParams

VOCAB = 32
EOS = 2


def fixed_logits(num_rows: int) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(3)) * 3


def reference(logits: torch.Tensor, p: SamplingParams, history: RowHistory) -> torch.Tensor:
    """One row [vocab] by the documented formulas, in vLLM v1's order (min_tokens, bias, penalties)."""
    out = logits.clone()
    if history.num_output_tokens < p.min_tokens:
        for t in {*p.stop_token_ids, *(() if p.ignore_eos else (EOS,))}:
            out[t] = float("-inf")
    for t, v in p.logit_bias:
        out[t] += v
    if p.repetition_penalty != 1:
        ids = torch.tensor([list(history.token_ids)])
        out = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, out[None])[0]
    output = list(history.token_ids[history.num_prompt_tokens :])
    for t in set(output):
        out[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return out


ROWS = [
    (SamplingParams(), RowHistory([1, 5, 5, 7], 2)),
    (SamplingParams(repetition_penalty=1.7), RowHistory([1, 5, 9, 9, 3], 2)),
    (SamplingParams(frequency_penalty=0.8, presence_penalty=-0.5), RowHistory([4, 6, 6, 6, 8, 4], 2)),
    (SamplingParams(logit_bias={3: 100.0, 4: -100.0, 0: 2.5}), RowHistory([1, 2], 2)),
    (SamplingParams(min_tokens=3, stop_token_ids=(11, 12)), RowHistory([1, 1, 9], 2)),
    (SamplingParams(min_tokens=3, ignore_eos=True, stop_token_ids=(11,)), RowHistory([1], 1)),
    (SamplingParams(min_tokens=1), RowHistory([1, 9], 1)),  # one token generated: no longer held
    (
        SamplingParams(
            repetition_penalty=0.6, frequency_penalty=2, presence_penalty=2, logit_bias={9: -3}, min_tokens=4
        ),
        RowHistory([9, 9, 10, 9, 2, 10, 31], 3),
    ),
]


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_each_processor_matches_its_reference_alone(index: int) -> None:
    params, history = ROWS[index]
    logits = fixed_logits(1)
    got = apply_logits_processors(logits, [params], [history], {EOS})
    torch.testing.assert_close(got[0], reference(logits[0], params, history))


def test_mixed_batch_rows_get_what_they_get_alone() -> None:
    logits = fixed_logits(len(ROWS))
    params, histories = [p for p, _ in ROWS], [h for _, h in ROWS]
    got = apply_logits_processors(logits, params, histories, {EOS})
    for i, (p, h) in enumerate(ROWS):
        torch.testing.assert_close(got[i], reference(logits[i], p, h))
    assert torch.equal(got[0], logits[0])  # a row that asks for nothing is untouched


def test_a_batch_without_processors_is_not_copied() -> None:
    logits = fixed_logits(2)
    assert apply_logits_processors(logits, [SamplingParams()] * 2, [RowHistory([1], 1)] * 2, {EOS}) is logits


def test_min_tokens_keeps_eos_and_stop_ids_from_being_sampled_greedily() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS] = 50.0
    logits[0, 11] = 40.0
    held = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=(11,))
    result = sample(logits, [held], [None], [RowHistory([1], 1)], {EOS})
    assert result.tokens[0] not in {EOS, 11}
    free = sample(logits, [held], [None], [RowHistory([1, 5, 6], 1)], {EOS})
    assert free.tokens == [EOS]


def test_logprobs_are_of_the_processed_distribution_before_temperature() -> None:
    logits = fixed_logits(3)
    params = [
        SamplingParams(temperature=0, logprobs=3, logit_bias={7: 5.0}),
        SamplingParams(temperature=0),  # asks nothing
        SamplingParams(temperature=1.5, logprobs=0, seed=1),
    ]
    histories = [RowHistory([1], 1)] * 3
    gens = [None, None, torch.Generator().manual_seed(1)]
    result = sample(logits, params, gens, histories, {EOS})
    processed = apply_logits_processors(logits, params, histories, {EOS})
    expected = torch.log_softmax(processed, dim=-1)  # temperature does not enter
    first, second, third = result.logprobs
    assert second is None
    assert first is not None and third is not None
    assert first.token_id == result.tokens[0] == int(expected[0].argmax())
    assert first.logprob == pytest.approx(float(expected[0].max()), abs=1e-6)
    top_values, top_ids = expected[0].topk(3)
    assert [t for t, _ in first.top] == top_ids.tolist()
    assert [v for _, v in first.top] == pytest.approx(top_values.tolist(), abs=1e-6)
    assert third.top == () and third.logprob == pytest.approx(float(expected[2, result.tokens[2]]), abs=1e-6)


def test_logprobs_rows_each_get_their_own_number_of_alternatives() -> None:
    logits = fixed_logits(2)
    params = [SamplingParams(logprobs=5), SamplingParams(logprobs=1)]
    got = token_logprobs(logits, params, [0, 1])
    assert [len(g.top) for g in got if g is not None] == [5, 1]


def test_out_of_vocabulary_bias_is_skipped_instead_of_failing_the_batch() -> None:
    logits = fixed_logits(1)
    got = apply_logits_processors(
        logits, [SamplingParams(logit_bias={VOCAB + 5: 10.0})], [RowHistory([1], 1)], ()
    )
    assert torch.equal(got, logits)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {5: 101}}, "logit_bias"),
        ({"logit_bias": {-1: 1}}, "logit_bias"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_out_of_range_parameters_are_refused_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
