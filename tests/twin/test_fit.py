"""fit_step_cost recovers the coefficients that generated the step times, picks the LoRA form that generated
them, and never returns a negative coefficient."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.twin.profile_helpers import tiny_profile
from twin.cost_model import CostModel
from twin.fit import COLUMNS, TimedStep, fit_step_cost, nonnegative_lstsq
from twin.step_shape import StepShape


def grid_shapes() -> list[StepShape]:
    shapes = []
    for num_prefill, num_decode, context, ranks in itertools.product(
        (0, 16, 64), (0, 1, 4), (0, 40, 200), ((), (8,), (8, 64), (8, 8, 8, 64))
    ):
        if num_prefill == 0 and num_decode == 0:
            continue
        decode_context = context * num_decode + (num_decode and 3)
        pairs = tuple((num_prefill if i == 0 and num_prefill else 1, rank) for i, rank in enumerate(ranks))
        shapes.append(
            StepShape(
                num_prefill_tokens=num_prefill,
                num_prefill_seqs=int(num_prefill > 0),
                prefill_attention_tokens=num_prefill * (context + num_prefill / 2),
                num_decode_seqs=num_decode,
                decode_context_tokens=decode_context,
                lora_token_ranks=pairs,
                adapter_ranks=tuple(sorted(ranks)),  # one adapter per entry
            )
        )
    return shapes


@pytest.mark.parametrize("form", ["sum", "max"])
def test_noise_free_steps_give_back_their_coefficients(form: str) -> None:
    truth = tiny_profile(lora_form=form, scheduler_us=9.0)
    model = CostModel(truth)
    samples = [TimedStep(s, model.step_seconds(s) - 9e-6) for s in grid_shapes()]
    fit = fit_step_cost(samples, scheduler_us=9.0)
    assert fit.step.lora_form == form and fit.r2 == pytest.approx(1.0) and fit.other_r2 < 1.0
    for name in COLUMNS:
        assert getattr(fit.step, name) == pytest.approx(getattr(truth.step, name), rel=1e-6, abs=1e-9)
    assert fit.step.scheduler_us == 9.0 and fit.num_samples == len(samples)


def test_a_column_the_data_would_make_negative_is_dropped() -> None:
    rng = np.random.default_rng(0)
    x = np.stack([np.ones(40), rng.uniform(0, 100, 40), rng.uniform(0, 1, 40)], axis=1)
    y = 5 + 2 * x[:, 1] - 30 * x[:, 2]  # the last column's slope is negative
    coef, _, _ = nonnegative_lstsq(x, y)
    assert (coef >= 0).all() and coef[2] == 0


def test_too_few_steps_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least 8 timed steps"):
        fit_step_cost([TimedStep(StepShape(num_decode_seqs=1), 1e-3)])
