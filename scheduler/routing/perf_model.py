"""Per-worker linear latency models (CaraServe's performance models), fitted by least squares on a profile.

A batch is a sequence of (num_tokens, rank) pairs, one per request (rank 0 = the base model, no adapter).
For one engine step:

    x          = total tokens (prefill) or number of sequences (decode: one token each)
    rank term  = "sum": sum_i tokens_i * rank_i            (segmented kernels: S-LoRA's MBGMV, SGMV)
                 "max": (sum_i tokens_i) * max_i rank_i    (kernels padded to the largest rank: Punica's BGMV)
    latency_ms = intercept_ms + per_unit_ms * x + per_rank_ms * rank term

For decode the two rank terms are CaraServe's `sum_rank(S)` and `|S| * max_rank(S)`. An empty batch costs 0
(no step runs). `fit_latency` fits both forms and keeps the one with the smaller residual (a tie, e.g. a
profile with only single-rank batches, where both terms are equal, keeps "sum"), recording both R^2. Slopes
are non-negative: a column whose least-squares slope comes out negative (noise) is dropped and the rest refit.
`PerfModel` holds the prefill and decode models (and optionally the adapter load time against rank); it is
plain JSON (`to_dict` / `from_dict`): the profile file `lorahost profile` writes, and what heartbeats carry.
The per-unit and rank terms are the step-cost terms shared with the digital twin's cost model
(scheduler/core/step_cost.py: `rank_term` is its `lora_work` over every request, base-model ones included).
Pure: numpy for the fit only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from scheduler.core.step_cost import LORA_FORMS, LoraForm, StepCostTerms, lora_work, pick_form

RankForm = LoraForm
RANK_FORMS: tuple[RankForm, ...] = LORA_FORMS
PROFILE_VERSION = 1
Batch = Sequence[tuple[int, int]]  # (num_tokens, rank) per request


def rank_term(batch: Batch, form: RankForm) -> float:
    """The LoRA work of a batch in `form` (token-weighted sum of ranks, or total tokens x max rank)."""
    return lora_work(batch, form)


@dataclass(frozen=True)
class LinearLatency:
    """latency_ms = intercept_ms + per_unit_ms * x + per_rank_ms * rank term (module doc); 0 for no batch.

    `x` counts tokens when `per_token` (prefill), sequences otherwise (decode). `r2` is this fit's R^2,
    `other_r2` the R^2 of the rejected rank form (None when not fitted).
    """

    intercept_ms: float
    per_unit_ms: float
    per_rank_ms: float
    rank_form: RankForm = "sum"
    per_token: bool = False
    r2: float = 0.0
    other_r2: float | None = None
    num_samples: int = 0

    def predict_ms(self, batch: Batch) -> float:
        """Predicted step latency of `batch` in milliseconds."""
        if not batch:
            return 0.0
        terms = self.terms
        num_tokens = sum(tokens for tokens, _ in batch) if self.per_token else 0
        return self.intercept_ms + terms.token_cost(num_tokens, len(batch)) + terms.lora_cost(batch)

    @cached_property
    def terms(self) -> StepCostTerms:
        """The shared step-cost terms of this model: per_unit_ms per token (prefill) or per sequence (decode),
        per_rank_ms per unit of the rank term."""
        return StepCostTerms(
            per_token=self.per_unit_ms if self.per_token else 0.0,
            per_seq=0.0 if self.per_token else self.per_unit_ms,
            per_token_rank=self.per_rank_ms,
            lora_form=self.rank_form,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values."""
        return {
            "intercept_ms": self.intercept_ms,
            "per_unit_ms": self.per_unit_ms,
            "per_rank_ms": self.per_rank_ms,
            "rank_form": self.rank_form,
            "per_token": self.per_token,
            "r2": self.r2,
            "other_r2": self.other_r2,
            "num_samples": self.num_samples,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LinearLatency:
        """Parse `to_dict` output (unknown keys ignored); ValueError naming what is wrong."""
        form = data.get("rank_form", "sum")
        if form not in RANK_FORMS:
            raise ValueError(f"rank_form must be one of {RANK_FORMS}, got {form!r}")
        other = data.get("other_r2")
        return cls(
            intercept_ms=float(data["intercept_ms"]),
            per_unit_ms=float(data["per_unit_ms"]),
            per_rank_ms=float(data["per_rank_ms"]),
            rank_form=form,
            per_token=bool(data.get("per_token", False)),
            r2=float(data.get("r2", 0.0)),
            other_r2=None if other is None else float(other),
            num_samples=int(data.get("num_samples", 0)),
        )


@dataclass(frozen=True)
class LoadLatency:
    """Time to put an adapter of a given rank on the device from host memory: intercept_ms + per_rank_ms * rank."""

    intercept_ms: float
    per_rank_ms: float

    def predict_ms(self, rank: int) -> float:
        """Predicted load time in milliseconds."""
        return self.intercept_ms + self.per_rank_ms * rank


@dataclass(frozen=True)
class PerfModel:
    """A worker's latency models: prefill and decode steps, and (optionally) adapter loads. `meta` holds
    descriptive strings (base model, device, dtype, threads, when profiled)."""

    prefill: LinearLatency
    decode: LinearLatency
    load: LoadLatency | None = None
    meta: Mapping[str, str] = field(default_factory=dict)

    def prefill_ms(self, batch: Batch) -> float:
        """One prefill of `batch` ((prompt tokens, rank) per request), milliseconds."""
        return self.prefill.predict_ms(batch)

    def decode_ms(self, ranks: Iterable[int]) -> float:
        """One decode step of sequences with these ranks, milliseconds."""
        return self.decode.predict_ms([(1, rank) for rank in ranks])

    def load_ms(self, rank: int) -> float:
        """Host -> device load of a rank-`rank` adapter (DEFAULT_LOAD when not profiled), milliseconds."""
        return (self.load or DEFAULT_LOAD).predict_ms(rank)

    def to_dict(self) -> dict[str, Any]:
        """The profile file's content (plain JSON)."""
        load = (
            None
            if self.load is None
            else {"intercept_ms": self.load.intercept_ms, "per_rank_ms": self.load.per_rank_ms}
        )
        return {
            "version": PROFILE_VERSION,
            "prefill": self.prefill.to_dict(),
            "decode": self.decode.to_dict(),
            "load": load,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PerfModel:
        """Parse a profile (`to_dict` output); ValueError naming what is wrong."""
        try:
            version = int(data.get("version", PROFILE_VERSION))
            if version != PROFILE_VERSION:
                raise ValueError(
                    f"unsupported profile version {version} (this build reads {PROFILE_VERSION})"
                )
            load = data.get("load")
            return cls(
                prefill=LinearLatency.from_dict({**data["prefill"], "per_token": True}),
                decode=LinearLatency.from_dict({**data["decode"], "per_token": False}),
                load=None
                if load is None
                else LoadLatency(float(load["intercept_ms"]), float(load["per_rank_ms"])),
                meta={str(k): str(v) for k, v in (data.get("meta") or {}).items()},
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a lorahost performance profile: missing or malformed {exc}") from exc


# Used for a worker that publishes no profile: a small CPU worker's order of magnitude (the tiny demo
# model at one thread), segmented kernels. Only relative costs matter to the router.
DEFAULT_LOAD = LoadLatency(intercept_ms=5.0, per_rank_ms=0.05)
DEFAULT_PERF_MODEL = PerfModel(
    prefill=LinearLatency(intercept_ms=5.0, per_unit_ms=0.05, per_rank_ms=0.0005, per_token=True),
    decode=LinearLatency(intercept_ms=5.0, per_unit_ms=0.2, per_rank_ms=0.002),
    load=DEFAULT_LOAD,
    meta={"source": "default"},
)


@dataclass(frozen=True)
class LatencySample:
    """One timed step: the batch ((tokens, rank) per request) and its latency."""

    batch: tuple[tuple[int, int], ...]
    latency_ms: float


def fit_latency(samples: Sequence[LatencySample], *, per_token: bool) -> LinearLatency:
    """The better of the "sum" and "max" fits (smaller residual; "sum" on a tie); ValueError with < 3 samples."""
    if len(samples) < 3:
        raise ValueError(f"fitting a latency model needs at least 3 samples, got {len(samples)}")
    y = np.array([s.latency_ms for s in samples], dtype=float)
    x = np.array([sum(t for t, _ in s.batch) if per_token else len(s.batch) for s in samples], dtype=float)
    fits = {
        form: _fit_columns(x, np.array([rank_term(s.batch, form) for s in samples]), y) for form in RANK_FORMS
    }
    best = pick_form({form: fit[1] for form, fit in fits.items()})
    other: RankForm = "sum" if best == "max" else "max"
    coef, _, r2 = fits[best]
    return LinearLatency(
        intercept_ms=coef[0],
        per_unit_ms=coef[1],
        per_rank_ms=coef[2],
        rank_form=best,
        per_token=per_token,
        r2=r2,
        other_r2=fits[other][2],
        num_samples=len(samples),
    )


def _fit_columns(
    x: np.ndarray, rank: np.ndarray, y: np.ndarray
) -> tuple[tuple[float, float, float], float, float]:
    """(intercept, x slope, rank slope), SSE and R^2 of y ~ 1 + x + rank with non-negative slopes."""
    columns = [np.ones_like(y), x, rank]
    active = [0, 1, 2]
    coef = np.zeros(3)
    while True:
        solution, *_ = np.linalg.lstsq(np.stack([columns[i] for i in active], axis=1), y, rcond=None)
        negative = [i for i, c in zip(active, solution) if i > 0 and c < 0]
        if not negative:
            break
        active.remove(min(negative, key=lambda i: solution[active.index(i)]))
    coef[active] = solution
    residual = y - sum(coef[i] * columns[i] for i in range(3))
    sse = float(residual @ residual)
    sst = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - sse / sst if sst > 0 else (1.0 if sse == 0 else 0.0)
    return (float(coef[0]), float(coef[1]), float(coef[2])), sse, r2


def fit_load(samples: Sequence[tuple[int, float]]) -> LoadLatency:
    """Load time vs rank from (rank, milliseconds) pairs (non-negative slope); ValueError with < 2 samples."""
    if len(samples) < 2:
        raise ValueError(f"fitting adapter load times needs at least 2 samples, got {len(samples)}")
    ranks = np.array([r for r, _ in samples], dtype=float)
    ms = np.array([m for _, m in samples], dtype=float)
    (intercept, _, per_rank), _, _ = _fit_columns(np.zeros_like(ranks), ranks, ms)
    return LoadLatency(intercept_ms=intercept, per_rank_ms=per_rank)
