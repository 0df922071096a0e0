"""The distilled model: per-GPU throughput, starvation and TTFT p99 predicted from `gpu_features`, trained only
on twin runs of one worker (`run_gpu`). The throughput model predicts the served fraction of the asked tokens (`GpuOutcome.served_fraction`;
scale-free, so a lightly loaded GPU is not pulled toward the samples' mean); throughput is that x the offered
rate. Two forms, as in the paper: a random forest (accurate) and a small tree
(`max_leaf_nodes` 32, cheap).

Training samples (`training_samples`): random GPUs (1-128 adapters of ranks 8-64 with skewed rates, a random
adapter cache from one slot to all, random prompt/output lengths) at 0.05-1.6x a rough analytic capacity, so
samples crowd the starvation boundary. Seeded; cached to a JSON file keyed by the profile, the engine
settings and the generator's parameters, so a later plan only refits (well under a second).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from settings.api import DEFAULT_MAX_LORA_RANK
from settings.engine import EngineSettings
from twin.planner.gpu_features import FEATURE_NAMES, capacity_req_s, gpu_features
from twin.planner.gpu_run import GpuSetup, run_gpu
from twin.planner.memory_check import cache_bytes_for_slots
from twin.planner.workload import AdapterLoad, LengthDistribution, Workload
from twin.profile import TwinProfile

GENERATOR_VERSION = 7
SurrogateForm = Literal["forest", "tree"]
_RANKS = (8, 16, 32, 64)


@dataclass(frozen=True)
class Sample:
    """One twin run: features and what the twin measured."""

    features: list[float]
    throughput_tok_s: float
    offered_tok_s: float
    served_fraction: float
    is_starved: bool
    ttft_p99_s: float


@dataclass(frozen=True)
class Prediction:
    """The surrogate's answer for one GPU."""

    throughput_tok_s: float
    served_fraction: float  # GpuOutcome.served_fraction: below STARVED_FRACTION is starving
    starvation_probability: float
    ttft_p99_s: float

    @property
    def is_starved(self) -> bool:
        """More likely starved than not."""
        return self.starvation_probability >= 0.5


@dataclass(frozen=True)
class TrainingConfig:
    """How many twin runs, of how long, from which seed."""

    num_samples: int = 150
    duration_s: float = 10.0
    seed: int = 0


def training_samples(
    profile: TwinProfile,
    engine: EngineSettings,
    config: TrainingConfig = TrainingConfig(),
    *,
    cache_dir: Path | None = None,
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK,
    progress: Callable[[int, int], None] | None = None,
) -> list[Sample]:
    """Twin runs (module doc), read from `cache_dir` when a file of the same key is there, else run and written."""
    key = _cache_key(profile, engine, config, max_lora_rank)
    path = cache_dir / f"surrogate-{key}.json" if cache_dir is not None else None
    if path is not None and path.is_file():
        data = json.loads(path.read_text())
        return [Sample(**row) for row in data["samples"]]
    rng = random.Random(config.seed)
    samples = []
    for index in range(config.num_samples):
        workload, setup = _random_gpu(profile, engine, rng)
        outcome = run_gpu(
            profile, engine, workload, setup, duration_s=config.duration_s, seed=rng.randrange(2**31),
            max_lora_rank=max_lora_rank,
        )  # fmt: skip
        if outcome.is_memory_overflow:
            continue
        features = gpu_features(profile, engine, workload, setup.adapters, setup.cache_bytes)
        samples.append(
            Sample(
                features,
                outcome.throughput_tok_s,
                outcome.offered_tok_s,
                outcome.served_fraction,
                outcome.is_starved,
                outcome.ttft_p99_s,
            )
        )
        if progress is not None:
            progress(index + 1, config.num_samples)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [vars(s) for s in samples]
        path.write_text(json.dumps({"key": key, "feature_names": FEATURE_NAMES, "samples": rows}))
    return samples


class Surrogate:
    """A random forest and a small tree fitted on twin samples; `predict` with either."""

    def __init__(self, samples: Sequence[Sample], *, seed: int = 0) -> None:
        if len(samples) < 4:
            raise ValueError(f"the surrogate needs at least 4 training samples, got {len(samples)}")
        x = np.array([s.features for s in samples])
        served = np.array([min(s.served_fraction, 1.2) for s in samples])
        starved = np.array([int(s.is_starved) for s in samples])
        log_ttft = np.log(np.maximum([s.ttft_p99_s for s in samples], 1e-4))
        self.num_samples = len(samples)
        self._models: dict[str, tuple[Any, Any, Any]] = {}
        for form in ("forest", "tree"):
            throughput_model, starved_model, ttft_model = _estimators(form, seed)
            self._models[form] = (
                throughput_model.fit(x, served),
                starved_model.fit(x, starved),
                ttft_model.fit(x, log_ttft),
            )

    def predict(self, rows: Sequence[Sequence[float]], form: SurrogateForm = "forest") -> list[Prediction]:
        """One prediction per feature row."""
        throughput_model, starved_model, ttft_model = self._models[form]
        x = np.array(rows, dtype=float)
        served = throughput_model.predict(x)
        offered = x[:, FEATURE_NAMES.index("offered_tok_s")]
        classes = list(starved_model.classes_)
        proba = starved_model.predict_proba(x)
        p_starved = proba[:, classes.index(1)] if 1 in classes else np.zeros(len(x))
        ttft = np.exp(ttft_model.predict(x))
        return [
            Prediction(float(min(s, 1.0) * o), float(s), float(p), float(f))
            for s, o, p, f in zip(served, offered, p_starved, ttft, strict=True)
        ]


def _estimators(form: str, seed: int) -> tuple[Any, Any, Any]:
    """Unfitted (throughput regressor, starvation classifier, log TTFT p99 regressor) of one form."""
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    if form == "forest":
        forest = {"n_estimators": 60, "min_samples_leaf": 2, "random_state": seed}
        return (
            RandomForestRegressor(**forest),
            RandomForestClassifier(**forest),
            RandomForestRegressor(**forest),
        )
    tree = {"max_leaf_nodes": 32, "random_state": seed}
    return DecisionTreeRegressor(**tree), DecisionTreeClassifier(**tree), DecisionTreeRegressor(**tree)


def _random_gpu(
    profile: TwinProfile, engine: EngineSettings, rng: random.Random
) -> tuple[Workload, GpuSetup]:
    prompt_p50 = math.exp(rng.uniform(math.log(32), math.log(1024)))
    output_p50 = math.exp(rng.uniform(math.log(16), math.log(512)))
    prompt = LengthDistribution(
        p50=prompt_p50, p90=prompt_p50 * rng.uniform(1.0, 3.0), max=4 * round(prompt_p50) + 64
    )
    output = LengthDistribution(
        p50=output_p50, p90=output_p50 * rng.uniform(1.0, 3.0), max=4 * round(output_p50) + 64
    )
    num_adapters = max(1, round(math.exp(rng.uniform(0.0, math.log(128)))))
    ranks = rng.sample(_RANKS, rng.randint(1, len(_RANKS)))
    weights = [rng.paretovariate(1.2) for _ in range(num_adapters)]
    capacity = capacity_req_s(profile, engine, prompt.mean, output.mean)
    total_rate = rng.uniform(0.05, 1.6) * capacity
    adapters = [
        AdapterLoad(name=f"s{i}", rank=rng.choice(ranks), rate=total_rate * w / sum(weights))
        for i, w in enumerate(weights)
    ]
    workload = Workload(prompt_tokens=prompt, output_tokens=output, adapters=adapters)
    planned = tuple(workload.expanded())
    num_slots = (
        max(1, round(math.exp(rng.uniform(0.0, math.log(num_adapters)))))
        if rng.random() < 0.3
        else num_adapters
    )
    return workload, GpuSetup(planned, cache_bytes_for_slots(profile, planned, num_slots))


def _cache_key(
    profile: TwinProfile, engine: EngineSettings, config: TrainingConfig, max_lora_rank: int
) -> str:
    content = {
        "generator": GENERATOR_VERSION,
        "profile": profile.to_dict(),
        "engine": engine.model_dump(mode="json"),
        "config": vars(config),
        "max_lora_rank": max_lora_rank,
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]
