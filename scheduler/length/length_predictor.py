"""Output-length predictor: request features + the recent history of the same tenant on the same adapter ->
output tokens.

Each adapter is a task with its own output-length distribution, so the model sees, next to the request's
own features (prompt tokens, max_tokens cap, chat vs completion, stop strings), summary features of the
recent true output lengths of the requesting tenant on that adapter (`PerAdapterHistory`: quantiles and an
EWMA). One global model is trained over all adapters; a (tenant, adapter) pair without enough history gets
the history features masked, so it falls back to the global prior learned for such requests (training masks
a random share of rows the same way, so that branch is trained on every adapter's traffic).

Histories are keyed by (tenant, adapter), never by adapter alone: the base model (adapter None) and public
adapters are shared by tenants, and a history shared between them let one tenant's traffic move another's
predictions, hence its place in `sjf`/multi-queue order and the router's load estimate (measured: tenant A's long
outputs moved B's base-model prediction from 1 to 300 tokens, B's TTFT under `sjf` from 1.2 to 9.2 s).
A private adapter has one tenant anyway; keying every history the same way keeps one rule.

No feature is derived from the prompt's content: features are stored with usage for training, and
the hashed word n-gram histogram used before narrowed down what a prompt said (its exact word count; 10,000
candidate PINs to 1,124). The prompt's size enters as its token count only, which is metered anyway.

Model choice, measured with `benchmarks/length_predictor.py` (2026-11-23; 100 adapters with power-law
popularity and per-adapter log-normal lengths, a third prompt-dependent, some chat-dependent, a text cue;
20k requests, chronological 80/20 split; MAE in tokens / bucket accuracy on the held-out 4k):
  gradient boosting (`HistGradientBoostingRegressor`, absolute error on log1p(tokens): a conditional median)
      MAE 72.0 / 54.9%, fit 2-4 s;
  linear median regression (`QuantileRegressor(quantile=0.5)` on the same features)  MAE 98.8 / 44.3%, fit 24 s;
  per-adapter history median (no model) 100.0 / 39.1%; global median 134.5 / 15.1%; max_tokens 865.9 / 1.8%;
  an oracle knowing each request's true conditional median (the noise floor) 54.4 / 64.6%.
  Without the prompt-text features (the text cue is then invisible to every predictor):
  boosting MAE 73.5 / 54.7%, linear 100.0 / 44.7% (benchmarks/RESULTS.md).
Boosting wins because the effect of the request features differs per adapter (an interaction of the history
features with prompt length / chat that a linear model cannot express), and it fits 6-10x faster. One
prediction walks the fitted trees in plain Python (scheduler/length/length_models.py): ~50 us mean, ~110 us p99 per call on a
busy 2-core machine, where sklearn's batch `predict` on one row took 6-7 ms p50 (thread-pool start-up).

Accuracy is reported as Chameleon does (bucket accuracy: predicted and true length in the same bucket of
BUCKET_EDGES) and as MAE in tokens, per adapter and overall (`evaluate`), with what ordering by size needs:
Spearman's rank correlation with the true lengths and per-bucket recall (scheduler/length/length_metrics.py; bucket
accuracy alone says little when ~90% of outputs fall in the smallest bucket).

A fitted predictor travels as a versioned artifact (`to_bytes`/`from_bytes`: plain JSON data, never a pickle;
scheduler/length/length_predictor_artifact.py). `from_bytes` raises `PredictorArtifactError` on anything it cannot
use; the caller then keeps serving with `LengthPredictor()` (no model: `prior_predict`) and logs the error.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.length import length_predictor_artifact as artifact
from scheduler.length.length_metrics import length_metrics
from scheduler.length.length_models import MODEL_KINDS, FittedModel, fit_model, model_from_dict
from scheduler.length.length_predictor_artifact import PredictorArtifactError

# Bucket upper edges in tokens: [1, 32), [32, 64), [64, 128), [128, 256), [256, 512), [512, 1024), [1024, inf).
# Powers of two, as the length classes of proxy-model predictors (muServe, Chameleon's BERT proxy) are
# coarse size classes; a prediction is "right" when it lands in the true length's class.
BUCKET_EDGES: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)

AdapterKey = Hashable  # an adapter id; None is the base model
TenantKey = str | None  # a tenant id; None only where there are no tenants (benchmarks, tests)
HistoryKey = tuple[TenantKey, AdapterKey]  # whose history: one per tenant and adapter


@dataclass(frozen=True)
class RequestFeatures:
    """What the predictor knows about one request when the API admits it: sizes and flags, never the prompt's
    content. `tenant_id` picks the history (with `adapter_id`), it is not a model feature."""

    adapter_id: AdapterKey
    num_prompt_tokens: int
    max_tokens: int
    is_chat: bool = False
    has_stop: bool = False
    tenant_id: TenantKey = None

    @property
    def history_key(self) -> HistoryKey:
        """The history this request reads and feeds: its tenant's on its adapter."""
        return (self.tenant_id, self.adapter_id)


@dataclass(frozen=True)
class LengthSample:
    """One finished request: its features and its true number of output tokens."""

    features: RequestFeatures
    num_output_tokens: int


def length_bucket(num_tokens: float) -> int:
    """The index of the BUCKET_EDGES class holding `num_tokens`."""
    for index, edge in enumerate(BUCKET_EDGES):
        if num_tokens < edge:
            return index
    return len(BUCKET_EDGES)


def clip_prediction(value: float, max_tokens: int) -> int:
    """A prediction rounded into [1, max_tokens] (a request never generates more than max_tokens)."""
    if not math.isfinite(value):
        return max(1, max_tokens)
    return int(min(max(1, round(value)), max(1, max_tokens)))


class PerAdapterHistory:
    """Recent true output lengths of one tenant on one adapter: a bounded window, kept sorted alongside so its
    quantiles are a few lookups (they are read by every prediction and invalidated by every finished request:
    numpy's quantile of the window cost ~4% of an API event loop at 2,000 streams), plus an EWMA."""

    def __init__(self, max_samples: int = 256, ewma_alpha: float = 0.1) -> None:
        self.max_samples = max_samples
        self.ewma_alpha = ewma_alpha
        self._lengths: deque[int] = deque(maxlen=max_samples)
        self._sorted: list[int] = []  # the window's lengths in order
        self._ewma: float | None = None
        self._quantiles: tuple[float, float, float] | None = None

    @property
    def num_samples(self) -> int:
        """How many lengths the window holds (at most max_samples)."""
        return len(self._lengths)

    @property
    def ewma(self) -> float | None:
        """The exponentially weighted mean of every observed length (None before the first)."""
        return self._ewma

    def observe(self, num_output_tokens: int) -> None:
        """Record one finished request's true output length."""
        if len(self._lengths) == self.max_samples:  # the oldest leaves the window
            del self._sorted[bisect_left(self._sorted, self._lengths[0])]
        self._lengths.append(num_output_tokens)
        insort(self._sorted, num_output_tokens)
        if self._ewma is None:
            self._ewma = float(num_output_tokens)
        else:
            self._ewma += self.ewma_alpha * (num_output_tokens - self._ewma)
        self._quantiles = None

    def quantiles(self) -> tuple[float, float, float]:
        """(p10, p50, p90) of the window; ValueError when empty."""
        if not self._lengths:
            raise ValueError("no history: observe() at least one length first")
        if self._quantiles is None:
            ordered = self._sorted
            self._quantiles = (
                linear_quantile(ordered, 0.1),
                linear_quantile(ordered, 0.5),
                linear_quantile(ordered, 0.9),
            )
        return self._quantiles

    @property
    def median(self) -> float | None:
        """The window's median (None when empty)."""
        return self.quantiles()[1] if self._lengths else None

    def to_state(self) -> tuple[list[int], float | None]:
        """Plain data for an artifact."""
        return list(self._lengths), self._ewma

    @classmethod
    def from_state(
        cls, state: tuple[list[int], float | None], max_samples: int, ewma_alpha: float
    ) -> PerAdapterHistory:
        """The inverse of to_state."""
        history = cls(max_samples, ewma_alpha)
        lengths, ewma = state
        history._lengths.extend(int(n) for n in lengths)
        history._sorted = sorted(history._lengths)
        history._ewma = None if ewma is None else float(ewma)
        return history


def linear_quantile(ordered: Sequence[int], q: float) -> float:
    """The q-quantile of non-empty sorted values, exactly as numpy.quantile's default ("linear") method
    computes it (the same floating-point operations in the same order)."""
    virtual = (len(ordered) - 1) * q
    if virtual >= len(ordered) - 1:
        return float(ordered[-1])
    lower = math.floor(virtual)
    gamma = virtual - lower
    below, above = float(ordered[lower]), float(ordered[lower + 1])
    diff = above - below
    return above - diff * (1 - gamma) if gamma >= 0.5 else below + diff * gamma


def prior_predict(features: RequestFeatures, history: PerAdapterHistory | None) -> int:
    """The fallback without a model: the history's median if it has one, else max_tokens."""
    median = history.median if history is not None else None
    return clip_prediction(features.max_tokens if median is None else median, features.max_tokens)


def feature_row(
    features: RequestFeatures, history: PerAdapterHistory | None, min_history_samples: int
) -> list[float]:
    """The model's input row (finite floats, never NaN): request features, then history features (zeros +
    flag 0 when the history is missing or shorter than min_history_samples)."""
    row = [
        math.log1p(max(0, features.num_prompt_tokens)),
        math.log1p(max(0, features.max_tokens)),
        float(features.is_chat),
        float(features.has_stop),
    ]
    if history is not None and history.num_samples >= min_history_samples:
        p10, p50, p90 = history.quantiles()
        ewma = history.ewma or 0.0
        row += [
            1.0,
            math.log1p(history.num_samples),
            math.log1p(p10),
            math.log1p(p50),
            math.log1p(p90),
            math.log1p(ewma),
        ]
    else:
        row += [0.0] * 6
    return row


class LengthPredictor:
    """One global model over request + history features; `prior_predict` before `fit`.

    Histories are keyed by (tenant id, adapter id) (`RequestFeatures.history_key`): one tenant's traffic
    never moves another's history, on a shared base model or public adapter too. `observe` feeds them online
    (a finished request's true length), so a fitted model follows a drifting distribution until the next
    retraining.
    """

    def __init__(
        self,
        model_kind: str = "hgb",
        max_history: int = 256,
        ewma_alpha: float = 0.1,
        min_history_samples: int = 3,
        history_dropout: float = 0.15,
        seed: int = 0,
    ) -> None:
        if model_kind not in MODEL_KINDS:
            raise ValueError(f"unknown model kind {model_kind!r}; choose one of {MODEL_KINDS}")
        self.model_kind = model_kind
        self.max_history = max_history
        self.ewma_alpha = ewma_alpha
        self.min_history_samples = min_history_samples
        self.history_dropout = history_dropout
        self.seed = seed
        self.model_version: str | None = None
        self.num_training_samples = 0
        self.histories: dict[HistoryKey, PerAdapterHistory] = {}
        self._model: FittedModel | None = None
        self.estimator: Any = (
            None  # the scikit-learn estimator fitted in this process (None after from_bytes)
        )

    @property
    def is_fitted(self) -> bool:
        """Whether a model is loaded (else predictions are `prior_predict`)."""
        return self._model is not None

    def history(self, tenant_id: TenantKey, adapter_id: AdapterKey) -> PerAdapterHistory | None:
        """The tenant's history on the adapter (None: never observed)."""
        return self.histories.get((tenant_id, adapter_id))

    def observe(self, tenant_id: TenantKey, adapter_id: AdapterKey, num_output_tokens: int) -> None:
        """Record a finished request's true output length in its tenant's history on its adapter."""
        key = (tenant_id, adapter_id)
        history = self.histories.get(key)
        if history is None:
            history = self.histories[key] = PerAdapterHistory(self.max_history, self.ewma_alpha)
        history.observe(num_output_tokens)

    def fit(self, samples: Sequence[LengthSample], model_version: str = "unversioned") -> LengthPredictor:
        """Train on samples in chronological order; histories restart from these samples.

        Each row's history features come from the earlier samples of its tenant on its adapter only (as when
        serving);
        a random `history_dropout` share of rows has them masked, which trains the new-adapter prior.
        """
        if not samples:
            raise ValueError("cannot fit a length predictor on zero samples")
        rng = np.random.default_rng(self.seed)
        is_masked = rng.random(len(samples)) < self.history_dropout
        self.histories = {}
        rows = []
        for sample, masked in zip(samples, is_masked, strict=True):
            history = None if masked else self.histories.get(sample.features.history_key)
            rows.append(feature_row(sample.features, history, self.min_history_samples))
            self.observe(*sample.features.history_key, sample.num_output_tokens)
        x = np.asarray(rows, dtype=np.float64)
        y = np.log1p(np.asarray([max(0, s.num_output_tokens) for s in samples], dtype=np.float64))
        self.estimator, self._model = fit_model(self.model_kind, self.seed, x, y)
        self.model_version = model_version
        self.num_training_samples = len(samples)
        return self

    def predict(self, features: RequestFeatures) -> int:
        """The expected output tokens, clipped to [1, max_tokens]; `prior_predict` without a model."""
        history = self.histories.get(features.history_key)
        if self._model is None:
            return prior_predict(features, history)
        raw = self._model.predict_one(feature_row(features, history, self.min_history_samples))
        return clip_prediction(math.expm1(min(raw, 30.0)), features.max_tokens)

    def to_bytes(self) -> bytes:
        """A versioned artifact (plain data, no pickle): the model, its version, the config and the histories."""
        return artifact.encode(
            {
                "model_version": self.model_version,
                "model_kind": self.model_kind,
                "num_training_samples": self.num_training_samples,
                "config": {
                    "max_history": self.max_history,
                    "ewma_alpha": self.ewma_alpha,
                    "min_history_samples": self.min_history_samples,
                    "history_dropout": self.history_dropout,
                    "seed": self.seed,
                },
                "model": None if self._model is None else self._model.to_dict(),
                "histories": [[*key, *h.to_state()] for key, h in self.histories.items()],
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> LengthPredictor:
        """Load an artifact written by to_bytes (no code in it runs); PredictorArtifactError says why one
        cannot be used."""
        state = artifact.decode(data)
        try:
            predictor = cls(model_kind=state["model_kind"], **state["config"])
            if state["model"] is not None:
                predictor._model = model_from_dict(state["model"])
                if state["model"]["kind"] != predictor.model_kind:
                    raise ValueError(f"a {state['model']['kind']} model in a {predictor.model_kind} artifact")
            predictor.model_version = state["model_version"]
            predictor.num_training_samples = int(state["num_training_samples"])
            predictor.histories = {
                (tenant, adapter): PerAdapterHistory.from_state(
                    (lengths, ewma), predictor.max_history, predictor.ewma_alpha
                )
                for tenant, adapter, lengths, ewma in state["histories"]
            }
        except (KeyError, TypeError, ValueError) as error:
            raise PredictorArtifactError(f"length predictor artifact is malformed: {error!r}") from error
        return predictor


def _metrics(errors: Iterable[tuple[int, int]]) -> dict[str, Any]:
    """num_samples, mae, bucket_accuracy, spearman, bucket_recall, bucket_num_samples (scheduler/length/length_metrics.py)."""
    return length_metrics(list(errors), BUCKET_EDGES).as_dict()


def evaluate(predictor: LengthPredictor, samples: Sequence[LengthSample]) -> dict[str, Any]:
    """MAE (tokens), bucket accuracy (BUCKET_EDGES), Spearman's rank correlation and per-bucket recall
    (scheduler/length/length_metrics.py) of `predictor` on held-out samples, overall and per
    adapter (all tenants of an adapter together): {"overall": {...}, "per_adapter": {adapter_id: {...}}}.
    Histories are not updated."""
    if not samples:
        raise ValueError("cannot evaluate on zero samples")
    pairs: dict[AdapterKey, list[tuple[int, int]]] = {}
    for sample in samples:
        predicted = predictor.predict(sample.features)
        pairs.setdefault(sample.features.adapter_id, []).append((predicted, sample.num_output_tokens))
    return {
        "overall": _metrics(p for group in pairs.values() for p in group),
        "per_adapter": {key: _metrics(group) for key, group in pairs.items()},
    }
