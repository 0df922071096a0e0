"""The chunked top-k (layers/row_topk.py) against a stable descending sort (equal values lower column first) on
rows with and without a tail past the last whole chunk, with ties, -0.0 and -inf; and the sampled tokens'
logprobs it serves against a plain log_softmax reference on a vocabulary wide enough to take the chunked
path."""

from __future__ import annotations

import pytest
import torch

from gpu_workers.engine.layers.logprobs import prompt_logprobs, token_logprobs
from gpu_workers.engine.layers.row_topk import CHUNK, row_topk
from scheduler.core.sampling import SamplingParams

FLOAT32_WIDE_ABS = 5e-5  # a log-probability's error in float32 over a ~50k vocabulary, against float64


def seeded(shape: tuple[int, int], seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 4


@pytest.mark.parametrize("width", [49152, 32000, 40 * CHUNK + 17, 3 * CHUNK])
@pytest.mark.parametrize("k", [1, 5, 20])
def test_top_values_and_ids_equal_torch_topk_on_distinct_values(width: int, k: int) -> None:
    values = seeded((16, width), seed=width + k)
    top, ids = row_topk(values, k)
    expected_top, expected_ids = values.topk(k, dim=-1)
    assert torch.equal(top, expected_top)
    assert torch.equal(ids, expected_ids)


def test_top_entries_in_the_tail_are_found() -> None:
    width = 10 * CHUNK + 9
    values = seeded((3, width), seed=1)
    values[0, -1] = 100.0  # the row's largest entry is the last column, past every whole chunk
    values[1, width - 9 : width - 4] = torch.tensor([90.0, 91.0, 92.0, 93.0, 94.0])
    top, ids = row_topk(values, 5)
    assert ids[0, 0] == width - 1 and top[0, 0] == 100.0
    assert ids[1].tolist() == [width - 5, width - 6, width - 7, width - 8, width - 9]


def stable_topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    top, ids = values.sort(dim=-1, descending=True, stable=True)
    return top[:, :k], ids[:, :k]


@pytest.mark.parametrize("width", [50 * CHUNK + 31, 49152, 3 * CHUNK])
@pytest.mark.parametrize("seed", range(4))
def test_equal_values_come_lower_column_first_and_the_first_is_argmax(width: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(-3, 3, (8, width), generator=generator).float()  # every value tied many times
    values[values < -2] = float("-inf")
    zeros = values[1].clamp(max=0.0)  # row 1's maximum is zero, as -0.0 and +0.0: equal, ranked by column
    zeros[zeros == 0] = -0.0
    every_third = zeros[::3]
    every_third[every_third == 0] = 0.0
    values[1] = zeros
    values[5] = float("-inf")
    values[5, [7, width - 1, 40]] = torch.tensor([1.0, 2.0, 1.0])  # fewer finite entries than k
    for k in (1, 6, 20):
        top, ids = row_topk(values, k)
        expected_top, expected_ids = stable_topk(values, k)
        assert torch.equal(top, expected_top)
        assert torch.equal(ids, expected_ids)
        assert torch.equal(ids[:, 0], values.max(dim=-1).indices)  # the greedy token leads its ties


def test_sampled_token_logprobs_equal_log_softmax_on_a_wide_vocabulary() -> None:
    logits = seeded((5, 49152), seed=7)
    logits[2, :100] = float("-inf")  # a row where a processor or mask ruled tokens out
    params = [SamplingParams(logprobs=n) for n in (5, None, 3, 0, 20)]
    tokens = [11, 12, 13, 14, 15]
    got = token_logprobs(logits, params, tokens)
    expected = torch.log_softmax(logits.double(), dim=-1)
    assert got[1] is None
    for row in (0, 2, 3, 4):
        lp = got[row]
        assert lp is not None and lp.token_id == tokens[row]
        # float32 over 49,152 logits: the log-sum-exp's rounding depends on the CPU's kernel (1.1e-5 seen on an
        # AMD EPYC without AVX-512), against a float64 reference
        assert lp.logprob == pytest.approx(float(expected[row, tokens[row]]), abs=FLOAT32_WIDE_ABS)
        top_values, top_ids = expected[row].topk(params[row].logprobs or 0)
        assert [t for t, _ in lp.top] == top_ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top_values.tolist(), abs=FLOAT32_WIDE_ABS)


def test_prompt_logprobs_top_alternatives_equal_log_softmax_on_a_wide_vocabulary() -> None:
    logits = seeded((4, 49152), seed=8)
    got = prompt_logprobs(logits, [1, 2, 3, 4], num_top=4)
    expected = torch.log_softmax(logits.double(), dim=-1)
    for position, lp in enumerate(got):
        top_values, top_ids = expected[position].topk(4)
        assert [t for t, _ in lp.top] == top_ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top_values.tolist(), abs=1e-5)
