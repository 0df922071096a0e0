"""Fitting a profile's step coefficients on timed steps (what `lorahost profile --twin-output` runs).

Each sample is a `StepShape` and the seconds its step took, less the scheduler's own time (that is the
separate `scheduler_us`). The device time is modelled as cost_model.py's additive form (multiplier 1,
no floor):

    us = fixed + a*P + b*prefill_attention + c*D + d*decode_context + e*W + f*A + g*sum(adapter ranks)

fitted by least squares of the RELATIVE error (each step weighted by 1 / its time: decode steps are 10-100x
shorter than prefills, and an absolute fit prices them by the prefills' residuals; measured on the tiny model,
an absolute fit put a decode step at 25x its time) with every coefficient >= 0 (a column whose coefficient
comes out negative, noise or collinearity, is dropped and the rest refit). Both LoRA forms are fitted (W as sum or max); the one with
the smaller residual is kept ("sum" on a tie; scheduler.core.step_cost.pick_form, shared with the router's
fit), and both R^2 are reported. Pure: numpy for the fit only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.step_cost import LORA_FORMS, LoraForm, lora_work, pick_form
from twin.profile import StepCost
from twin.step_shape import StepShape

COLUMNS = (
    "fixed_us",
    "per_prefill_token_us",
    "per_prefill_attention_us",
    "per_decode_seq_us",
    "per_decode_context_token_us",
    "lora_per_token_rank_us",
    "lora_per_adapter_us",
    "lora_per_adapter_rank_us",
)


@dataclass(frozen=True)
class TimedStep:
    """One measured step: its shape and its device seconds (scheduler time excluded)."""

    shape: StepShape
    seconds: float


@dataclass(frozen=True)
class StepFit:
    """The fitted coefficients (a `StepCost`), this form's R^2 and the other form's, and the sample count."""

    step: StepCost
    r2: float
    other_r2: float
    num_samples: int


def features(shape: StepShape, form: LoraForm) -> list[float]:
    """The fit's columns for one step, in COLUMNS order."""
    return [
        1.0,
        float(shape.num_prefill_tokens),
        shape.prefill_attention_tokens,
        float(shape.num_decode_seqs),
        float(shape.decode_context_tokens),
        lora_work(shape.lora_token_ranks, form),
        float(shape.num_distinct_adapters),
        float(sum(shape.adapter_ranks)),
    ]


def fit_step_cost(samples: Sequence[TimedStep], *, scheduler_us: float = 0.0) -> StepFit:
    """The better of the two LoRA forms' non-negative fits; ValueError with fewer samples than columns."""
    if len(samples) < len(COLUMNS):
        raise ValueError(f"fitting step costs needs at least {len(COLUMNS)} timed steps, got {len(samples)}")
    y = np.array([s.seconds * 1e6 for s in samples], dtype=float)
    weights = 1.0 / np.maximum(y, 1e-3)
    fits = {
        form: nonnegative_lstsq(np.array([features(s.shape, form) for s in samples], dtype=float), y, weights)
        for form in LORA_FORMS
    }
    best = pick_form({form: fit[1] for form, fit in fits.items()})
    coef, _, r2 = fits[best]
    values = {name: float(c) for name, c in zip(COLUMNS, coef)}
    step = StepCost.model_validate({**values, "lora_form": best, "scheduler_us": scheduler_us})
    return StepFit(
        step=step, r2=r2, other_r2=fits["max" if best == "sum" else "sum"][2], num_samples=len(samples)
    )


def device_us(shape: StepShape, step: StepCost) -> float:
    """The fitted additive device time of `shape` (the COLUMNS terms of `step`), microseconds."""
    coefficients = [getattr(step, name) for name in COLUMNS]
    return float(sum(f * c for f, c in zip(features(shape, step.lora_form), coefficients)))


def fit_host_prefill(samples: Sequence[TimedStep], step: StepCost) -> StepCost:
    """`step` with its CPU-assisted prefill terms fitted on host-assisted steps (each has entries in
    `shape.host_token_ranks`): what a step took beyond its device part (`device_us`), as

        host us = host_prefill_step_us + host_prefill_per_token_rank_us * max_j tokens_j * rank_j

    (one CPU worker per host-assisted entry, in parallel; the engine waits for them projection by projection,
    so the term adds to the device's: `is_host_prefill_overlapped` False). Relative error, coefficients
    >= 0, as the step fit. No samples: `step` unchanged."""
    if not samples:
        return step
    y = np.array([s.seconds * 1e6 for s in samples], dtype=float)
    excess = y - np.array([device_us(s.shape, step) for s in samples])
    x = np.array([[1.0, float(host_work(s.shape))] for s in samples])
    coef, _, _ = nonnegative_lstsq(x, excess, 1.0 / np.maximum(y, 1e-3))
    return step.model_copy(
        update={
            "host_prefill_step_us": float(coef[0]),
            "host_prefill_per_token_rank_us": float(coef[1]),
            "is_host_prefill_overlapped": False,
        }
    )


def host_work(shape: StepShape) -> int:
    """The slowest CPU worker's tokens x rank among the host-assisted entries (0 when none)."""
    return max((tokens * rank for tokens, rank in shape.host_token_ranks), default=0)


def nonnegative_lstsq(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, float, float]:
    """Coefficients >= 0 of y ~ x minimising the sum of (weight * residual)^2 (columns scaled for
    conditioning; an all-zero column gets 0), that weighted SSE and the (unweighted) R^2."""
    w = np.ones(len(y)) if weights is None else weights
    scale = np.abs(x).max(axis=0)
    active = [j for j in range(x.shape[1]) if scale[j] > 0]
    coef = np.zeros(x.shape[1])
    while active:
        xs = x[:, active] / scale[active]
        solution, *_ = np.linalg.lstsq(xs * w[:, None], y * w, rcond=None)
        solution = solution / scale[active]
        if (solution >= 0).all():
            coef[active] = solution
            break
        active.pop(int(np.argmin(solution)))
    residual = y - x @ coef
    sse = float(residual @ residual)
    sst = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - sse / sst if sst > 0 else (1.0 if sse == 0 else 0.0)
    weighted = residual * w
    return coef, float(weighted @ weighted), r2
