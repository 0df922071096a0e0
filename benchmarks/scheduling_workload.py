"""The scheduling benchmark's workload (pure, seeded): per-adapter output lengths, the predictor's history,
predictions, and the size classes.

- Prompts, arrivals and adapters: `serving_workload.build_workload` (Azure conv trace rows, prompt lengths
  `* length_scale` clipped to [8, max_prompt_tokens], Poisson arrivals at 1 req/s that the sweep rescales,
  Zipf popularity over the adapters in `popularity_order`).
- Output lengths: each adapter is a task with its own distribution, a log-normal around a median drawn from
  the trace's output lengths (GeneratedTokens of a random row `* length_scale`), with its own spread
  (sigma uniform in SIGMA_RANGE); every request draws its true length from its adapter's distribution,
  clipped to [1, max_output_tokens]. So some adapters are short and some long, as in the trace.
- History: `num_history` earlier requests of the same adapters (same popularity), prompt lengths from trace
  rows after the workload's, true lengths from the same per-adapter distributions; a `LengthPredictor` is
  trained on its first 80% (chronological) and evaluated on the rest (held-out MAE, bucket accuracy).
- Policy history: the last `num_prime` history requests, with predictions, arriving before the replay at
  the point's rate, are shown to the batch policy before it starts (`prime_requests`; a long-running
  server's policy has seen its recent traffic).
- Requests carry the prediction (`predicted_output_tokens`, what the batch policy sees) and the API's cap
  (`max_tokens` = max_output_tokens); the replay stops each one at its true `output_tokens`.
- Size classes: small / medium / large by the true total tokens (prompt + output), cut at the workload's
  tertiles (fixed once per workload, the same for every system and load).
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving_metrics import pct
from serving_workload import read_trace, zipf_weights

from scheduler.length.length_predictor import (
    BUCKET_EDGES,
    LengthPredictor,
    LengthSample,
    RequestFeatures,
    evaluate,
)

SIGMA_RANGE = (0.2, 0.8)  # per-adapter log-normal spread of output lengths
SIZE_CLASSES = ("small", "medium", "large")
HELD_OUT_SHARE = 0.2  # of the history, chronological: the predictor's held-out split
MIN_PROMPT_TOKENS = 8  # as serving_workload.WorkloadSpec


@dataclass(frozen=True)
class OutputLengthModel:
    """One adapter's output-length distribution: log-normal(log(median), sigma), clipped to [1, max]."""

    median: float
    sigma: float

    def draw(self, rng: random.Random, max_output_tokens: int) -> int:
        """One true output length."""
        value = self.median * math.exp(rng.gauss(0.0, self.sigma))
        return max(1, min(max_output_tokens, round(value)))


def output_length_models(
    adapters: Sequence[str],
    trace_generated: Sequence[int],
    length_scale: float,
    max_output_tokens: int,
    seed: int,
) -> dict[str, OutputLengthModel]:
    """Per adapter: a median = the GeneratedTokens of a random trace row * length_scale (in [1, max]), and a
    sigma uniform in SIGMA_RANGE (seeded; the same adapters and seed give the same models)."""
    if not trace_generated:
        raise ValueError("the trace has no rows to draw output lengths from")
    rng = random.Random(seed + 11)
    models = {}
    for adapter in adapters:
        median = min(float(max_output_tokens), max(1.0, rng.choice(trace_generated) * length_scale))
        models[adapter] = OutputLengthModel(median, rng.uniform(*SIGMA_RANGE))
    return models


def scaled_prompt_tokens(context_tokens: int, length_scale: float, max_prompt_tokens: int) -> int:
    """A trace row's prompt length scaled to the model (as serving_workload.build_workload does)."""
    return max(MIN_PROMPT_TOKENS, min(max_prompt_tokens, round(context_tokens * length_scale)))


def features(adapter: str, num_prompt_tokens: int, max_output_tokens: int) -> RequestFeatures:
    """What the predictor knows of a request: adapter, prompt length and the API's max_tokens cap."""
    return RequestFeatures(adapter, num_prompt_tokens, max_output_tokens)


def history_samples(
    models: dict[str, OutputLengthModel],
    popularity: Sequence[str],
    zipf_alpha: float,
    prompt_contexts: Sequence[int],
    length_scale: float,
    max_prompt_tokens: int,
    max_output_tokens: int,
    seed: int,
) -> list[LengthSample]:
    """One past request per entry of `prompt_contexts` (trace ContextTokens): adapter by the same Zipf
    popularity, true length from its adapter's model (seeded, independent of the workload's draws)."""
    rng = random.Random(seed + 12)
    weights = zipf_weights(len(popularity), zipf_alpha)
    adapters = rng.choices(list(popularity), weights=weights, k=len(prompt_contexts))
    return [
        LengthSample(
            features(adapter, scaled_prompt_tokens(ctx, length_scale, max_prompt_tokens), max_output_tokens),
            models[adapter].draw(rng, max_output_tokens),
        )
        for adapter, ctx in zip(adapters, prompt_contexts, strict=True)
    ]


def scaled_bucket_accuracy(pairs: Sequence[tuple[int, int]], length_scale: float) -> float:
    """Share of (predicted, true) pairs in the same length class once BUCKET_EDGES are scaled like the lengths
    (the library's classes start at 32 tokens, above most scaled outputs)."""
    edges = [edge * length_scale for edge in BUCKET_EDGES]

    def bucket(n: float) -> int:
        return next((i for i, edge in enumerate(edges) if n < edge), len(edges))

    return sum(bucket(p) == bucket(t) for p, t in pairs) / len(pairs) if pairs else 0.0


def prediction_report(
    predictor: LengthPredictor, samples: Sequence[LengthSample], length_scale: float
) -> dict:
    """MAE (tokens), bucket accuracy (BUCKET_EDGES and scaled edges) and per-adapter MAE median."""
    report = evaluate(predictor, samples)
    pairs = [(predictor.predict(s.features), s.num_output_tokens) for s in samples]
    per_adapter = sorted(m["mae"] for m in report["per_adapter"].values())
    return {
        "num_samples": len(samples),
        "mae": round(report["overall"]["mae"], 3),
        "bucket_accuracy": round(report["overall"]["bucket_accuracy"], 4),
        "bucket_accuracy_scaled": round(scaled_bucket_accuracy(pairs, length_scale), 4),
        "median_adapter_mae": round(pct(per_adapter, 50) or 0.0, 3),
    }


def train_predictor(history: Sequence[LengthSample], seed: int) -> tuple[LengthPredictor, list[LengthSample]]:
    """A gradient-boosted LengthPredictor fitted on the first (1 - HELD_OUT_SHARE) of the history; returns it
    and the held-out rest."""
    if len(history) < 10:
        raise ValueError(f"the predictor needs at least 10 history samples, got {len(history)}")
    cut = int(len(history) * (1 - HELD_OUT_SHARE))
    predictor = LengthPredictor(model_kind="hgb", seed=seed).fit(
        history[:cut], model_version="bench-scheduling"
    )
    return predictor, list(history[cut:])


def attach_lengths(
    requests: list[dict[str, Any]],
    models: dict[str, OutputLengthModel],
    predictor: LengthPredictor,
    max_output_tokens: int,
    seed: int,
) -> list[dict[str, Any]]:
    """The requests with their true `output_tokens` (from their adapter's model), the API cap `max_tokens` and
    the prediction `predicted_output_tokens` (from prompt length, adapter and cap only)."""
    rng = random.Random(seed + 13)
    out = []
    for r in requests:
        true = models[r["adapter"]].draw(rng, max_output_tokens)
        predicted = predictor.predict(features(r["adapter"], r["prompt_tokens"], max_output_tokens))
        out.append(
            {
                **r,
                "output_tokens": true,
                "max_tokens": max_output_tokens,
                "predicted_output_tokens": predicted,
            }
        )
    return out


def prime_requests(
    history: Sequence[LengthSample], predictor: LengthPredictor, num_prime: int, seed: int
) -> list[dict[str, Any]]:
    """The last `num_prime` history requests as the batch policy sees them, arriving before the replay
    (negative `arrival_s`: Poisson gaps at 1 req/s, ending at 0; rescale them with the replay's rate)."""
    recent = list(history)[-num_prime:] if num_prime > 0 else []
    rng = random.Random(seed + 15)
    gaps = [rng.expovariate(1.0) for _ in recent]
    offsets = [-sum(gaps[i:]) for i in range(len(recent))]  # the last one arrives one gap before 0
    return [
        {
            "request_id": f"prime-{i}",
            "arrival_s": round(offset, 6),
            "adapter": s.features.adapter_id,
            "prompt_tokens": s.features.num_prompt_tokens,
            "max_tokens": s.features.max_tokens,
            "predicted_output_tokens": predictor.predict(s.features),
        }
        for i, (s, offset) in enumerate(zip(recent, offsets, strict=True))
    ]


# ------------------------------------------------------------------------------------------ size classes


def size_cutoffs(total_tokens: Sequence[int]) -> tuple[float, float]:
    """Tertile cut-offs (33.3rd and 66.7th percentiles) of the requests' true total tokens."""
    if not total_tokens:
        raise ValueError("no requests to cut into size classes")
    values = list(total_tokens)
    return pct(values, 100 / 3), pct(values, 200 / 3)  # type: ignore[return-value]


def size_class(total_tokens: int, cutoffs: tuple[float, float]) -> str:
    """small (<= first cut-off), medium (<= second) or large."""
    if total_tokens <= cutoffs[0]:
        return "small"
    return "medium" if total_tokens <= cutoffs[1] else "large"


def total_tokens(request: dict[str, Any]) -> int:
    """A request's true size: prompt tokens (with special tokens) + true output tokens."""
    return int(request["prompt_tokens"]) + int(request["output_tokens"])


# ------------------------------------------------------------------------------------------ trace fallback


def synthetic_trace_rows(num_rows: int, seed: int) -> list[tuple[float, int, int]]:
    """(seconds, context tokens, generated tokens) shaped like the Azure conv trace (log-normal lengths with
    medians ~1020 / ~130 tokens, Poisson arrivals at ~5 req/s): the stand-in when the CSV is missing."""
    rng = random.Random(seed + 14)
    rows, t = [], 0.0
    for _ in range(num_rows):
        t += rng.expovariate(5.0)
        context = max(1, min(8000, round(1020 * math.exp(rng.gauss(0.0, 0.9)))))
        generated = max(1, min(2000, round(130 * math.exp(rng.gauss(0.0, 0.8)))))
        rows.append((t, context, generated))
    return rows


def write_trace_csv(rows: Sequence[tuple[float, int, int]], path: Path) -> Path:
    """Write rows in the trace's CSV format (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    from datetime import datetime, timedelta

    start = datetime(2023, 11, 16, 18, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for t, context, generated in rows:
            stamp = (start + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f")
            writer.writerow([stamp, context, generated])
    return path


def trace_lengths(path: Path) -> tuple[list[int], list[int]]:
    """(ContextTokens, GeneratedTokens) of every trace row, in time order."""
    rows = read_trace(path)
    return [c for _, c, _ in rows], [g for _, _, g in rows]
