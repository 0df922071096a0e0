"""fit_step_cost recovers the coefficients that generated the step times, picks the LoRA form that generated
them, and never returns a negative coefficient; fit_host_prefill recovers the host-assisted prefill terms
from what such steps took beyond their device part."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.twin.profile_helpers import tiny_profile
from twin.cost_model import CostModel
from twin.fit import (
    COLUMNS,
    TimedStep,
    device_us,
    fit_host_prefill,
    fit_step_cost,
    host_work,
    nonnegative_lstsq,
)
from twin.step_shape import StepShape

HOST_FIELDS = ("host_prefill_step_us", "host_prefill_per_token_rank_us", "is_host_prefill_overlapped")


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


def host_shapes() -> list[StepShape]:
    """Host-assisted prefills of one or two cold adapters, alone or beside decoding rows of a device adapter."""
    shapes = []
    for tokens, ranks, num_decode in itertools.product((8, 64, 256), ((8,), (64,), (8, 32)), (0, 3)):
        host = tuple((tokens // (i + 1), rank) for i, rank in enumerate(ranks))
        shapes.append(
            StepShape(
                num_prefill_tokens=sum(t for t, _ in host),
                num_prefill_seqs=len(host),
                prefill_attention_tokens=sum(t * t / 2 for t, _ in host),
                num_decode_seqs=num_decode,
                decode_context_tokens=40 * num_decode,
                lora_token_ranks=((1, 16),) * num_decode,
                adapter_ranks=(16,) if num_decode else (),
                host_token_ranks=host,
            )
        )
    return shapes


def test_the_host_terms_are_what_host_assisted_steps_took_beyond_their_device_part() -> None:
    truth = tiny_profile(host_prefill_step_us=300.0, host_prefill_per_token_rank_us=0.2)
    truth = truth.model_copy(
        update={"step": truth.step.model_copy(update={"is_host_prefill_overlapped": False})}
    )
    model = CostModel(truth)
    samples = [TimedStep(s, model.step_seconds(s)) for s in host_shapes()]
    device_only = tiny_profile().step  # the device coefficients, no host terms yet
    step = fit_host_prefill(samples, device_only)
    assert step.host_prefill_step_us == pytest.approx(300.0, rel=1e-6)
    assert step.host_prefill_per_token_rank_us == pytest.approx(0.2, rel=1e-6)
    assert step.is_host_prefill_overlapped is False
    assert step.model_dump(exclude=set(HOST_FIELDS)) == device_only.model_dump(exclude=set(HOST_FIELDS))
    # the slowest worker decides: 64 x 8 beside 32 x 32 is 1024 token-ranks of work
    two = StepShape(num_prefill_tokens=96, num_prefill_seqs=2, host_token_ranks=((64, 8), (32, 32)))
    assert host_work(two) == 1024 and device_us(two, device_only) == pytest.approx(100 + 2 * 96)


def test_host_steps_no_slower_than_their_device_part_fit_no_host_cost() -> None:
    device_only = tiny_profile().step
    model = CostModel(tiny_profile())  # prices host entries at nothing beyond the device's part
    samples = [TimedStep(s, model.device_seconds(s) * 0.9) for s in host_shapes()]
    step = fit_host_prefill(samples, device_only)
    assert step.host_prefill_step_us == 0 and step.host_prefill_per_token_rank_us == 0
    assert fit_host_prefill([], device_only) == device_only
