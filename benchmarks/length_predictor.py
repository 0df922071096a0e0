"""Output-length predictor: which model (gradient boosting vs linear median regression) and how fast.

Synthetic traffic, seeded: `--num-adapters` adapters with power-law popularity, each with its own
log-normal output length (median log-uniform in 8..800 tokens, sigma 0.2..0.8); a third of them scale
with the prompt length, a quarter are shorter for chat requests, and prompts that contain the word
"briefly" are 3x shorter for every adapter (a content cue: no predictor sees the prompt's
content, so it is noise the oracle alone knows; the hashed n-gram features that saw it leaked the prompt). Chronological
80/20 split. Systems side by side in one run: the max_tokens placeholder, a global median, the per-adapter
history median (`prior_predict`), `LengthPredictor` with each model kind, and an oracle that knows each
request's true conditional median (the noise floor: no predictor can do better in expectation). One JSON line per result:
MAE, bucket accuracy, Spearman's rank correlation with the true lengths and per-bucket recall (with each
bucket's true samples: bucket accuracy alone says little when most outputs fall in one bucket), fit seconds, and per-call predict latency (mean/p50/p99 microseconds, one request at a
time as the API calls it); the last line compares with sklearn's own batch `predict` on one row.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/length_predictor.py [--num-samples 20000]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from scheduler.length.length_models import MODEL_KINDS
from scheduler.length.length_predictor import (
    LengthPredictor,
    LengthSample,
    RequestFeatures,
    evaluate,
    feature_row,
)

WORDS = (
    "please",
    "write",
    "explain",
    "the",
    "code",
    "story",
    "list",
    "data",
    "summary",
    "table",
    "email",
    "about",
    "with",
    "for",
    "and",
    "a",
    "of",
    "in",
    "my",
    "this",
)


def make_adapters(num_adapters: int, rng: np.random.Generator) -> list[dict[str, float | bool]]:
    return [
        {
            "median": float(np.exp(rng.uniform(np.log(8), np.log(800)))),
            "sigma": float(rng.uniform(0.2, 0.8)),
            "is_prompt_scaled": bool(rng.random() < 0.33),
            "is_chat_shorter": bool(rng.random() < 0.25),
        }
        for _ in range(num_adapters)
    ]


def make_samples(
    num_samples: int, num_adapters: int, max_tokens: int, seed: int
) -> tuple[list[LengthSample], list[float]]:
    """The samples and each one's true conditional median (what an oracle of the distribution predicts)."""
    rng = np.random.default_rng(seed)
    adapters = make_adapters(num_adapters, rng)
    popularity = 1.0 / np.arange(1, num_adapters + 1) ** 1.1
    popularity /= popularity.sum()
    samples, medians = [], []
    for index in rng.choice(num_adapters, size=num_samples, p=popularity):
        adapter = adapters[index]
        num_prompt = int(np.exp(rng.uniform(np.log(16), np.log(2000))))
        is_chat = bool(rng.random() < 0.5)
        words = list(rng.choice(WORDS, size=int(rng.integers(5, 30))))
        if rng.random() < 0.2:
            words.insert(int(rng.integers(len(words))), "briefly")
        median = adapter["median"] * (num_prompt / 300 if adapter["is_prompt_scaled"] else 1.0)
        median *= 0.4 if (is_chat and adapter["is_chat_shorter"]) else 1.0
        median /= 3.0 if "briefly" in words else 1.0
        true = median * rng.lognormal(0, adapter["sigma"])
        features = RequestFeatures(
            f"adapter-{index}",
            num_prompt,
            max_tokens,
            is_chat=is_chat,
            has_stop=bool(rng.random() < 0.3),
        )
        samples.append(LengthSample(features, int(min(max_tokens, max(1, round(true))))))
        medians.append(min(max_tokens, max(1.0, median)))
    return samples, medians


class _Constant(LengthPredictor):
    def __init__(self, value: int) -> None:
        super().__init__()
        self.value = value

    def predict(self, features: RequestFeatures) -> int:
        return min(self.value, features.max_tokens)


class _Oracle(LengthPredictor):
    """Knows each held-out request's true conditional median: the noise floor of MAE/bucket accuracy."""

    def __init__(self, medians: dict[int, int]) -> None:  # id(features) -> median
        super().__init__()
        self.medians = medians

    def predict(self, features: RequestFeatures) -> int:
        return self.medians[id(features)]


def latency_us(predict, features: list[RequestFeatures]) -> dict[str, float]:
    times = []
    for f in features:
        start = time.perf_counter()
        predict(f)
        times.append((time.perf_counter() - start) * 1e6)
    return {
        "mean_us": float(np.mean(times)),
        "p50_us": float(np.percentile(times, 50)),
        "p99_us": float(np.percentile(times, 99)),
    }


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def summary(report: dict) -> dict:
    """MAE, bucket accuracy, and what ordering by size needs: Spearman's rank correlation with the true
    lengths and per-bucket recall (null: no true sample in that bucket) with each bucket's true samples."""
    per_adapter = report["per_adapter"].values()
    overall = report["overall"]
    return {
        "mae": round(overall["mae"], 2),
        "bucket_accuracy": round(overall["bucket_accuracy"], 4),
        "spearman": _rounded(overall["spearman"]),
        "bucket_recall": [_rounded(r, 3) for r in overall["bucket_recall"]],
        "bucket_num_samples": overall["bucket_num_samples"],
        "median_adapter_mae": round(float(np.median([m["mae"] for m in per_adapter])), 2),
        "num_adapters_evaluated": len(report["per_adapter"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-samples", type=int, default=20000)
    parser.add_argument("--num-adapters", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-latency-calls", type=int, default=5000)
    args = parser.parse_args()
    samples, medians = make_samples(args.num_samples, args.num_adapters, args.max_tokens, args.seed)
    cut = int(0.8 * len(samples))
    train, held_out = samples[:cut], samples[cut:]
    common = {"num_train": len(train), "num_held_out": len(held_out), "num_adapters": args.num_adapters}

    global_median = int(np.median([s.num_output_tokens for s in train]))
    baselines = {"max_tokens": LengthPredictor(), "global_median": _Constant(global_median)}
    for name, predictor in baselines.items():
        print(json.dumps({"system": name, **common, **summary(evaluate(predictor, held_out))}), flush=True)

    oracle = {id(s.features): round(m) for s, m in zip(held_out, medians[cut:], strict=True)}
    oracle_report = evaluate(_Oracle(oracle), held_out)
    print(json.dumps({"system": "oracle_true_median", **common, **summary(oracle_report)}), flush=True)

    fitted: dict[str, LengthPredictor] = {}
    for kind in MODEL_KINDS:
        start = time.perf_counter()
        predictor = LengthPredictor(model_kind=kind, seed=args.seed).fit(train, model_version=f"bench-{kind}")
        fit_s = time.perf_counter() - start
        fitted[kind] = predictor
        calls = [s.features for s in held_out[: args.num_latency_calls]]
        print(
            json.dumps(
                {
                    "system": f"length_predictor_{kind}",
                    **common,
                    **summary(evaluate(predictor, held_out)),
                    "fit_s": round(fit_s, 2),
                    "artifact_bytes": len(predictor.to_bytes()),
                    **{k: round(v, 1) for k, v in latency_us(predictor.predict, calls).items()},
                }
            ),
            flush=True,
        )

    history_only = LengthPredictor()
    history_only.histories = fitted[MODEL_KINDS[0]].histories
    print(
        json.dumps(
            {"system": "adapter_history_median", **common, **summary(evaluate(history_only, held_out))}
        ),
        flush=True,
    )

    hgb = fitted["hgb"]
    calls = [s.features for s in held_out[:500]]

    def sklearn_one(features: RequestFeatures) -> float:
        row = feature_row(
            features, hgb.history(features.tenant_id, features.adapter_id), hgb.min_history_samples
        )
        return float(hgb.estimator.predict(np.asarray([row]))[0])

    print(
        json.dumps(
            {
                "system": "hgb_sklearn_predict_one_row",
                **{k: round(v, 1) for k, v in latency_us(sklearn_one, calls).items()},
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
