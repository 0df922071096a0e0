"""Scheduler test fixtures: a synthetic output-length training set and a predictor fitted on it."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.length.length_predictor import LengthPredictor, LengthSample, RequestFeatures

MAX_TOKENS = 512


def synthetic_samples(num_samples: int, seed: int) -> list[LengthSample]:
    """A ~ 20 tokens, B ~ 200 tokens, C ~ half the prompt length; arrivals interleaved at random."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(num_samples):
        adapter = rng.choice(["A", "B", "C"])
        num_prompt = int(rng.integers(20, 800))
        if adapter == "A":
            true = 20 * rng.lognormal(0, 0.2)
        elif adapter == "B":
            true = 200 * rng.lognormal(0, 0.2)
        else:
            true = 0.5 * num_prompt * rng.lognormal(0, 0.1)
        features = RequestFeatures(str(adapter), num_prompt, MAX_TOKENS, is_chat=bool(rng.integers(2)))
        samples.append(LengthSample(features, int(min(MAX_TOKENS, max(1, round(true))))))
    return samples


@pytest.fixture(scope="module")
def split() -> tuple[list[LengthSample], list[LengthSample]]:
    samples = synthetic_samples(3000, seed=1)
    return samples[:2400], samples[2400:]


@pytest.fixture(scope="module")
def fitted(split: tuple[list[LengthSample], list[LengthSample]]) -> LengthPredictor:
    return LengthPredictor(seed=0).fit(split[0], model_version="test-1")
